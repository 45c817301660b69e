// Everything a stanc-generated model and the ahmc bridge include: compiled once into a
// precompiled header per toolchain and flags, so each model compile parses none of it.
#ifndef AHMC_STAN_PCH_HPP
#define AHMC_STAN_PCH_HPP
#include <stan/math/mix.hpp>
#include <stan/model/model_header.hpp>
#include <stan/io/json/json_data.hpp>
#include <stan/io/random_var_context.hpp>
#include <stan/io/chained_var_context.hpp>
#include <stan/io/empty_var_context.hpp>
#include <stan/services/util/create_rng.hpp>
#include <stan/version.hpp>
#endif
