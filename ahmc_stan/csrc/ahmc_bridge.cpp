// ahmc-stan's C layer over a stanc-generated Stan model.
//
// It exports the BridgeStan 2.9 C API (the functions and version symbols that the
// `bridgestan` Python package looks up), written from BridgeStan's documented interface,
// so that the unmodified `bridgestan.StanModel` loads a library built here.  Below the
// BridgeStan section come ahmc-stan's own entry points for samplers (prefix `ahmc_`).
//
// The model itself lives in a separate translation unit (the stanc output), which defines
// `new_model`; this file is compiled once per toolchain and linked against every model.
//
// Threads: Stan's autodiff tape is thread-local (STAN_THREADS).  Every function that uses
// autodiff first calls `ensure_ad_tape()`, so it works when first called from any thread;
// so does every function that runs the model's code with doubles (log density,
// write_array), whose stiff ODE and algebraic solvers nest autodiff.
// Errors: functions return 0 on success and non-zero on failure, with a message in
// `*error_msg` (allocated with malloc, released by `bs_free_error_msg`) when asked for.

#include <stan_pch.hpp>

#include <boost/random/normal_distribution.hpp>

#include "ahmc_low_rank.hpp"
#include "ahmc_triangular.hpp"
#include "ahmc_tuner.hpp"

#include <chrono>
#include <cstdint>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

// Defined in the model's translation unit by stanc.
stan::model::model_base& new_model(stan::io::var_context& data_context,
                                   unsigned int seed, std::ostream* msg_stream);

// Second-order autodiff on the model's concrete class, defined in the model's translation
// unit by csrc/ahmc_second_order.hpp; absent (null) when the model's functions have no
// fvar<var> instances (ODE and algebraic solvers, 1-D integrators), in which case
// Hessians are central differences of autodiff gradients (see model_hessian below).
namespace ahmc_native {
void model_hessian(const stan::model::model_base* base, bool propto, bool jacobian,
                   const Eigen::VectorXd& x, double& lp, Eigen::VectorXd& grad,
                   Eigen::MatrixXd& hess, std::ostream* msgs) __attribute__((weak));
void model_hessian_times_vector(const stan::model::model_base* base, bool propto,
                                bool jacobian, const Eigen::VectorXd& x,
                                const Eigen::VectorXd& v, double& lp, Eigen::VectorXd& hv,
                                std::ostream* msgs) __attribute__((weak));
}  // namespace ahmc_native

#ifndef AHMC_BUILD_INFO
#define AHMC_BUILD_INFO "unknown"
#endif

namespace {

using stan::math::var;
using vector_d = Eigen::VectorXd;
template <typename T>
using vector_t = Eigen::Matrix<T, Eigen::Dynamic, 1>;

// ---------------------------------------------------------------------------------------
// Output of Stan `print` statements: std::cout unless a callback is installed.

using print_callback_t = void (*)(const char*, size_t);

class callback_buffer : public std::stringbuf {
 public:
  explicit callback_buffer(print_callback_t cb) : callback_(cb) {}

 protected:
  int sync() override {
    std::string s = str();
    if (!s.empty()) {
      callback_(s.data(), s.size());
      str("");
    }
    return 0;
  }

 private:
  print_callback_t callback_;
};

std::mutex print_mutex;
std::ostream* print_stream = &std::cout;
std::unique_ptr<callback_buffer> print_buffer;
std::unique_ptr<std::ostream> print_callback_stream;

// ---------------------------------------------------------------------------------------

void ensure_ad_tape() {
  // Constructing a ChainableStack on a thread that has no tape gives it one; on a
  // thread that already has one it does nothing.  Destroyed when the thread ends.
  static thread_local stan::math::ChainableStack thread_tape;
}

void set_error(char** error_msg, const char* msg) {
  if (error_msg) {
    *error_msg = strdup(msg);
  }
}

// Run `f`, turning any C++ exception into a non-zero return and an error message.
template <typename F>
int guarded(char** error_msg, F&& f) {
  try {
    f();
    return 0;
  } catch (const std::exception& e) {
    set_error(error_msg, e.what());
  } catch (...) {
    set_error(error_msg, "unknown C++ exception");
  }
  return -1;
}

std::string join(const std::vector<std::string>& names) {
  std::string out;
  for (size_t i = 0; i < names.size(); ++i) {
    if (i > 0) out += ',';
    out += names[i];
  }
  return out;
}

std::string read_data_argument(const char* data) {
  std::string text = data ? data : "";
  const std::string suffix = ".json";
  if (text.size() > suffix.size()
      && text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0
      && text.find('{') == std::string::npos) {
    std::ifstream in(text);
    if (!in) {
      throw std::invalid_argument("could not open data file " + text);
    }
    std::stringstream buffer;
    buffer << in.rdbuf();
    return buffer.str();
  }
  return text;
}

// The log density for the four (propto, jacobian) combinations, for any scalar type.
template <typename T>
T log_prob(const stan::model::model_base& model, bool propto, bool jacobian,
           vector_t<T>& x, std::ostream* msgs) {
  if (propto) {
    return jacobian ? model.log_prob_propto_jacobian(x, msgs)
                    : model.log_prob_propto(x, msgs);
  }
  return jacobian ? model.log_prob_jacobian(x, msgs) : model.log_prob(x, msgs);
}

// The log density as a functor of the unconstrained parameters, for Stan Math's
// reverse-mode functionals (gradient, and the finite differences of gradients below).
struct log_density_functor {
  const stan::model::model_base& model;
  bool propto;
  bool jacobian;
  std::ostream* msgs;

  template <typename T>
  T operator()(const vector_t<T>& x) const {
    vector_t<T> y = x;
    return log_prob(model, propto, jacobian, y, msgs);
  }
};

bool hessian_autodiff() { return ahmc_native::model_hessian != nullptr; }

// Log density, gradient and Hessian: forward-over-reverse autodiff where the model has it,
// else Stan Math's central differences of autodiff gradients (2n + 1 gradients, steps
// scaled to each coordinate).
void model_hessian(const stan::model::model_base& model, bool propto, bool jacobian,
                   const vector_d& x, double& lp, vector_d& grad, Eigen::MatrixXd& hess) {
  if (hessian_autodiff()) {
    ahmc_native::model_hessian(&model, propto, jacobian, x, lp, grad, hess, print_stream);
  } else {
    stan::math::internal::finite_diff_hessian_auto(
        log_density_functor{model, propto, jacobian, print_stream}, x, lp, grad, hess);
  }
}

// Log density and Hessian-vector product, likewise (the fallback: central differences of
// two autodiff gradients along v).
void model_hessian_times_vector(const stan::model::model_base& model, bool propto,
                                bool jacobian, const vector_d& x, const vector_d& v,
                                double& lp, vector_d& hv) {
  if (ahmc_native::model_hessian_times_vector != nullptr) {
    ahmc_native::model_hessian_times_vector(&model, propto, jacobian, x, v, lp, hv,
                                            print_stream);
  } else {
    stan::math::internal::finite_diff_hessian_times_vector_auto(
        log_density_functor{model, propto, jacobian, print_stream}, x, v, lp, hv);
  }
}

// A diagonal-plus-low-rank inverse metric M^-1 = S (I + V (Lambda - I) V') S, S =
// diag(sqrt(D)), V (n x k) with orthonormal columns (ahmc_stan/tuning/windows.py,
// low_rank_inv_metric), packed by ahmc_stan/metric.py as {k, sqrt(D)[n], 1/sqrt(D)[n],
// lambda - 1 [k], lambda^-1/2 - 1 [k], V[n x k] row-major}: O(nk) per product instead of
// O(n^2).
struct low_rank_metric {
  low_rank_metric(const double* packed, Eigen::Index n)
      : k(static_cast<Eigen::Index>(packed[0])), root_d(packed + 1, n),
        inv_root_d(packed + 1 + n, n), c(packed + 1 + 2 * n, k),
        c_root(packed + 1 + 2 * n + k, k), vecs(packed + 1 + 2 * n + 2 * k, n, k) {}
  // M^-1 v = S (w + V (c .* V'w)) with w = S v; or, with `root`, the momentum
  // S^-1 (v + V (c_root .* V'v)) whose covariance is M for v ~ N(0, I).  The products
  // are ahmc_low_rank.hpp's.
  void apply(const Eigen::Ref<const vector_d>& v, Eigen::Ref<vector_d> out, bool root) const {
    if (root) {
      ahmc_low_rank::product(vecs, c_root.data(), v.data(), inv_root_d.data(), out.data());
    } else {
      thread_local vector_d w;
      w = root_d.cwiseProduct(v);
      ahmc_low_rank::product(vecs, c.data(), w.data(), root_d.data(), out.data());
    }
  }
  // out = (I + V (c_root .* V')) S^-1 dx, whose squared norm is dx' M dx.
  void whiten(const Eigen::Ref<const vector_d>& dx, Eigen::Ref<vector_d> out) const {
    thread_local vector_d w;
    w = inv_root_d.cwiseProduct(dx);
    ahmc_low_rank::product(vecs, c_root.data(), w.data(), nullptr, out.data());
  }
  Eigen::Index k;
  Eigen::Map<const vector_d> root_d, inv_root_d, c, c_root;
  Eigen::Map<const ahmc_low_rank::row_major> vecs;
};

// out = M^-1 v for the inverse metric kinds of the sampler entry points: 0 identity,
// 1 diagonal (a vector), 2 dense (row-major matrix), 3 diagonal plus low rank
// (low_rank_metric).  `out` must not alias `v`.
void apply_inv_metric(int metric, const double* inv_metric,
                      const Eigen::Ref<const vector_d>& v, Eigen::Ref<vector_d> out) {
  const Eigen::Index n = v.size();
  if (metric == 0) {
    out = v;
  } else if (metric == 1) {
    out = Eigen::Map<const vector_d>(inv_metric, n).cwiseProduct(v);
  } else if (metric == 3) {
    low_rank_metric(inv_metric, n).apply(v, out, false);
  } else {
    out.noalias() = Eigen::Map<const Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic,
                                                   Eigen::RowMajor>>(inv_metric, n, n) * v;
  }
}

// Kinetic energy p' M^-1 p / 2, using `work` as scratch space (dense metric only).
double kinetic_energy(int metric, const double* inv_metric,
                      const Eigen::Ref<const vector_d>& p, Eigen::Ref<vector_d> work) {
  const Eigen::Index n = p.size();
  const double* pv = p.data();
  double sum = 0.0;
  if (metric == 0) {
    for (Eigen::Index i = 0; i < n; ++i) sum += pv[i] * pv[i];
  } else if (metric == 1) {
    for (Eigen::Index i = 0; i < n; ++i) sum += pv[i] * pv[i] * inv_metric[i];
  } else {
    apply_inv_metric(metric, inv_metric, p, work);
    sum = p.dot(work);
  }
  return 0.5 * sum;
}

}  // namespace

// =======================================================================================
// The BridgeStan 2.9 C API.

struct bs_model {
  stan::model::model_base* model;
  std::string name;
  std::string info;
  std::string param_unc_names;
  std::string param_names[2][2];  // [include_tp][include_gq]
  int param_num[2][2];
  int param_unc_num;

  ~bs_model() { delete model; }
};

struct bs_rng {
  stan::rng_t rng;
  explicit bs_rng(unsigned int seed) : rng(stan::services::util::create_rng(seed, 0)) {}
};

extern "C" {

int bs_major_version = 2;
int bs_minor_version = 9;
int bs_patch_version = 0;

bs_model* bs_model_construct(const char* data, unsigned int seed, char** error_msg) {
  bs_model* result = nullptr;
  int rc = guarded(error_msg, [&] {
    ensure_ad_tape();
    std::string json = read_data_argument(data);
    std::unique_ptr<stan::io::var_context> context;
    if (json.find_first_not_of(" \t\r\n") == std::string::npos) {
      context.reset(new stan::io::empty_var_context());
    } else {
      std::istringstream in(json);
      context.reset(new stan::json::json_data(in));
    }
    std::unique_ptr<bs_model> m(new bs_model());
    m->model = &new_model(*context, seed, print_stream);
    m->name = m->model->model_name();
    std::ostringstream info;
    info << "ahmc-stan bridge (BridgeStan " << bs_major_version << '.'
         << bs_minor_version << '.' << bs_patch_version << " C API)\n"
         << "Stan " << stan::MAJOR_VERSION << '.' << stan::MINOR_VERSION << '.'
         << stan::PATCH_VERSION << ", Stan Math " << STAN_MATH_MAJOR << '.'
         << STAN_MATH_MINOR << '.' << STAN_MATH_PATCH << "\n"
         << "build: " << AHMC_BUILD_INFO << "\n"
         // the defines, one per line as BridgeStan's model_info lists them: nutpie
         // runs chains in threads only on a library that says STAN_THREADS=true
#ifdef STAN_THREADS
         << "STAN_THREADS=true\n";
#else
         << "STAN_THREADS=false\n";
#endif
    for (const auto& line : m->model->model_compile_info()) {
      info << line << "\n";
    }
    m->info = info.str();
    for (int tp = 0; tp < 2; ++tp) {
      for (int gq = 0; gq < 2; ++gq) {
        std::vector<std::string> names;
        m->model->constrained_param_names(names, tp, gq);
        m->param_names[tp][gq] = join(names);
        m->param_num[tp][gq] = static_cast<int>(names.size());
      }
    }
    std::vector<std::string> unc_names;
    m->model->unconstrained_param_names(unc_names, false, false);
    m->param_unc_names = join(unc_names);
    m->param_unc_num = static_cast<int>(m->model->num_params_r());
    result = m.release();
  });
  return rc == 0 ? result : nullptr;
}

void bs_model_destruct(bs_model* m) { delete m; }

void bs_free_error_msg(char* error_msg) { free(error_msg); }

const char* bs_name(const bs_model* m) { return m->name.c_str(); }

const char* bs_model_info(const bs_model* m) { return m->info.c_str(); }

const char* bs_param_names(const bs_model* m, bool include_tp, bool include_gq) {
  return m->param_names[include_tp][include_gq].c_str();
}

const char* bs_param_unc_names(const bs_model* m) {
  return m->param_unc_names.c_str();
}

int bs_param_num(const bs_model* m, bool include_tp, bool include_gq) {
  return m->param_num[include_tp][include_gq];
}

int bs_param_unc_num(const bs_model* m) { return m->param_unc_num; }

int bs_param_constrain(const bs_model* m, bool include_tp, bool include_gq,
                       const double* theta_unc, double* theta, bs_rng* rng,
                       char** error_msg) {
  return guarded(error_msg, [&] {
    ensure_ad_tape();  // write_array's stiff ODE and algebraic solvers nest autodiff
    if (include_gq && rng == nullptr) {
      throw std::invalid_argument("an RNG is required to compute generated quantities");
    }
    static thread_local bs_rng unused_rng(0);
    vector_d x = Eigen::Map<const vector_d>(theta_unc, m->param_unc_num);
    vector_d out;
    m->model->write_array(rng ? rng->rng : unused_rng.rng, x, out, include_tp,
                          include_gq, print_stream);
    std::copy(out.data(), out.data() + out.size(), theta);
  });
}

int bs_param_unconstrain(const bs_model* m, const double* theta, double* theta_unc,
                         char** error_msg) {
  return guarded(error_msg, [&] {
    vector_d x = Eigen::Map<const vector_d>(theta, m->param_num[0][0]);
    vector_d out;
    m->model->unconstrain_array(x, out, print_stream);
    std::copy(out.data(), out.data() + out.size(), theta_unc);
  });
}

int bs_param_unconstrain_json(const bs_model* m, const char* json, double* theta_unc,
                              char** error_msg) {
  return guarded(error_msg, [&] {
    std::istringstream in(json ? json : "{}");
    stan::json::json_data context(in);
    vector_d out;
    m->model->transform_inits(context, out, print_stream);
    std::copy(out.data(), out.data() + out.size(), theta_unc);
  });
}

int bs_param_initialize(const bs_model* m, const char* json, bs_rng* rng,
                        double init_radius, int max_tries, bool jacobian,
                        double* theta_unc, char** error_msg) {
  return guarded(error_msg, [&] {
    ensure_ad_tape();
    if (rng == nullptr) {
      throw std::invalid_argument("an RNG is required to initialize parameters");
    }
    std::string given = (json && *json) ? json : "{}";
    std::istringstream in(given);
    stan::json::json_data user_context(in);
    std::string last_error = "log density or gradient not finite";
    for (int attempt = 0; attempt < max_tries; ++attempt) {
      stan::io::random_var_context random_context(*m->model, rng->rng, init_radius,
                                                  init_radius <= 0);
      stan::io::chained_var_context context(user_context, random_context);
      vector_d x;
      try {
        m->model->transform_inits(context, x, print_stream);
        stan::math::nested_rev_autodiff nested;
        vector_t<var> xv = x.cast<var>();
        var lp = log_prob(*m->model, true, jacobian, xv, print_stream);
        lp.grad();
        bool finite = std::isfinite(lp.val());
        for (int i = 0; i < xv.size() && finite; ++i) {
          finite = std::isfinite(xv(i).adj());
        }
        if (finite) {
          std::copy(x.data(), x.data() + x.size(), theta_unc);
          return;
        }
      } catch (const std::domain_error& e) {
        last_error = e.what();
      }
    }
    throw std::domain_error("no initial point with finite log density and gradient in "
                            + std::to_string(max_tries) + " attempts (uniform("
                            + std::to_string(-init_radius) + ", "
                            + std::to_string(init_radius)
                            + ") on the unconstrained scale); last problem: "
                            + last_error);
  });
}

int bs_log_density(const bs_model* m, bool propto, bool jacobian,
                   const double* theta_unc, double* lp, char** error_msg) {
  return guarded(error_msg, [&] {
    ensure_ad_tape();  // also with doubles: stiff ODE and algebraic solvers nest autodiff
    if (propto) {
      // Dropping constants needs autodiff types: with doubles Stan drops every term.
      stan::math::nested_rev_autodiff nested;
      vector_t<var> x = Eigen::Map<const vector_d>(theta_unc, m->param_unc_num)
                            .cast<var>();
      *lp = log_prob(*m->model, propto, jacobian, x, print_stream).val();
    } else {
      vector_d x = Eigen::Map<const vector_d>(theta_unc, m->param_unc_num);
      *lp = log_prob(*m->model, propto, jacobian, x, print_stream);
    }
  });
}

}  // extern "C"

namespace {

// Log density and gradient by reverse-mode autodiff; throws what the model throws.
double log_density_gradient(const bs_model* m, bool propto, bool jacobian,
                            const double* theta_unc, double* grad) {
  ensure_ad_tape();
  stan::math::nested_rev_autodiff nested;
  const int n = m->param_unc_num;
  vector_t<var> x(n);
  for (int i = 0; i < n; ++i) {
    x.coeffRef(i) = theta_unc[i];
  }
  var lp = log_prob(*m->model, propto, jacobian, x, print_stream);
  lp.grad();
  for (int i = 0; i < n; ++i) {
    grad[i] = x.coeff(i).adj();
  }
  return lp.val();
}

}  // namespace

extern "C" {

int bs_log_density_gradient(const bs_model* m, bool propto, bool jacobian,
                            const double* theta_unc, double* val, double* grad,
                            char** error_msg) {
  return guarded(error_msg, [&] {
    *val = log_density_gradient(m, propto, jacobian, theta_unc, grad);
  });
}

int bs_log_density_hessian(const bs_model* m, bool propto, bool jacobian,
                           const double* theta_unc, double* val, double* grad,
                           double* hessian, char** error_msg) {
  return guarded(error_msg, [&] {
    ensure_ad_tape();
    const int n = m->param_unc_num;
    vector_d x = Eigen::Map<const vector_d>(theta_unc, n);
    vector_d g;
    Eigen::MatrixXd h;
    double lp;
    model_hessian(*m->model, propto, jacobian, x, lp, g, h);
    *val = lp;
    std::copy(g.data(), g.data() + n, grad);
    std::copy(h.data(), h.data() + h.size(), hessian);
  });
}

int bs_log_density_hessian_vector_product(const bs_model* m, bool propto, bool jacobian,
                                          const double* theta_unc, const double* vector,
                                          double* val, double* hvp, char** error_msg) {
  return guarded(error_msg, [&] {
    ensure_ad_tape();
    const int n = m->param_unc_num;
    vector_d x = Eigen::Map<const vector_d>(theta_unc, n);
    vector_d v = Eigen::Map<const vector_d>(vector, n);
    vector_d hv;
    double lp;
    model_hessian_times_vector(*m->model, propto, jacobian, x, v, lp, hv);
    *val = lp;
    std::copy(hv.data(), hv.data() + n, hvp);
  });
}

bs_rng* bs_rng_construct(unsigned int seed, char** error_msg) {
  bs_rng* result = nullptr;
  guarded(error_msg, [&] { result = new bs_rng(seed); });
  return result;
}

void bs_rng_destruct(bs_rng* rng) { delete rng; }

int bs_set_print_callback(print_callback_t callback, char** error_msg) {
  return guarded(error_msg, [&] {
    std::lock_guard<std::mutex> lock(print_mutex);
    if (callback == nullptr) {
      print_stream = &std::cout;
      return;
    }
    auto buffer = std::make_unique<callback_buffer>(callback);
    auto stream = std::make_unique<std::ostream>(buffer.get());
    stream->setf(std::ios::unitbuf);  // hand every write to the callback at once
    print_stream = stream.get();
    // The previous stream is kept alive by being swapped out only after the new one is
    // installed; models constructed earlier hold no pointer to it (they get it per call).
    print_callback_stream.swap(stream);
    print_buffer.swap(buffer);
  });
}

// =======================================================================================
// ahmc-stan's entry points for samplers.  The Python side calls them through ctypes with
// preallocated buffers; none allocates an error message.

int ahmc_layer_version() { return 4; }

// 1 if Hessians and Hessian-vector products are exact (forward-over-reverse autodiff,
// csrc/ahmc_second_order.hpp), 0 if central differences of autodiff gradients.
int ahmc_hessian_autodiff() { return hessian_autodiff() ? 1 : 0; }

// Log density and gradient with no error message: returns 0, or 1 when the model threw or
// the result is not finite (the caller treats the point as having density zero).
int ahmc_log_density_gradient(const bs_model* m, bool propto, bool jacobian,
                              const double* theta_unc, double* lp, double* grad) {
  try {
    *lp = log_density_gradient(m, propto, jacobian, theta_unc, grad);
  } catch (...) {
    *lp = -std::numeric_limits<double>::infinity();
    return 1;
  }
  if (!std::isfinite(*lp)) return 1;
  for (int i = 0; i < m->param_unc_num; ++i) {
    if (!std::isfinite(grad[i])) return 1;
  }
  return 0;
}

// ahmc_log_density_gradient at `n_rows` points (rows of `theta_unc`, row-major) in one
// call: the log densities to `lp` and the gradients to the rows of `grad`, each as that
// function leaves them.  Returns how many points it flagged (threw or not finite).
int ahmc_log_density_gradient_rows(const bs_model* m, int n_rows, const double* theta_unc,
                                   double* lp, double* grad) {
  const size_t n = m->param_unc_num;
  int flagged = 0;
  for (int i = 0; i < n_rows; ++i) {
    flagged += ahmc_log_density_gradient(m, true, true, theta_unc + i * n, lp + i,
                                         grad + i * n);
  }
  return flagged;
}

// bs_param_constrain for `n_rows` points (rows of `theta_unc`, row-major) in one call, the
// generated quantities drawing from one Stan RNG seeded with `seed`, created here.  Rows
// of `theta` have bs_param_num(m, include_tp, include_gq) values.
int ahmc_param_constrain_rows(const bs_model* m, bool include_tp, bool include_gq,
                              int n_rows, const double* theta_unc, unsigned int seed,
                              double* theta, char** error_msg) {
  return guarded(error_msg, [&] {
    ensure_ad_tape();  // write_array's stiff ODE and algebraic solvers nest autodiff
    bs_rng rng(seed);
    const int n = m->param_unc_num;
    const int n_out = m->param_num[include_tp][include_gq];
    vector_d x(n), out;
    for (int i = 0; i < n_rows; ++i) {
      x = Eigen::Map<const vector_d>(theta_unc + static_cast<size_t>(i) * n, n);
      m->model->write_array(rng.rng, x, out, include_tp, include_gq, print_stream);
      std::copy(out.data(), out.data() + n_out, theta + static_cast<size_t>(i) * n_out);
    }
  });
}

// Seconds per gradient evaluation measured inside the library (the bare C++ cost):
// `n_reps` evaluations at `theta_unc`, timed with a steady clock.
double ahmc_gradient_seconds(const bs_model* m, const double* theta_unc, int n_reps) {
  std::vector<double> grad(m->param_unc_num);
  double lp = 0;
  ahmc_log_density_gradient(m, true, true, theta_unc, &lp, grad.data());  // warm up
  auto start = std::chrono::steady_clock::now();
  for (int r = 0; r < n_reps; ++r) {
    ahmc_log_density_gradient(m, true, true, theta_unc, &lp, grad.data());
  }
  std::chrono::duration<double> elapsed = std::chrono::steady_clock::now() - start;
  return elapsed.count() / n_reps;
}

}  // extern "C"

// =======================================================================================
// The leapfrog shared by the sampler entry points below, and the random numbers of
// ahmc_hmc_block.

namespace {

// Leapfrog steps in place (see ahmc_leapfrog); `velocity` is work space of size n.
int leapfrog(const bs_model* m, int n_steps, double eps, int metric, const double* inv_metric,
             Eigen::Ref<vector_d> x, Eigen::Ref<vector_d> p, Eigen::Ref<vector_d> grad,
             double* lp, vector_d& velocity) {
  const Eigen::Index n = x.size();
  double *xv = x.data(), *pv = p.data(), *gv = grad.data();
  const double half = 0.5 * eps;
  for (int step = 0; step < n_steps; ++step) {
    // half step in p and full step in x, fused for the identity and diagonal metrics
    if (metric == 0) {
      for (Eigen::Index i = 0; i < n; ++i) xv[i] += eps * (pv[i] += half * gv[i]);
    } else if (metric == 1) {
      for (Eigen::Index i = 0; i < n; ++i)
        xv[i] += eps * inv_metric[i] * (pv[i] += half * gv[i]);
    } else {
      p += half * grad;
      apply_inv_metric(metric, inv_metric, p, velocity);
      x += eps * velocity;
    }
    if (ahmc_log_density_gradient(m, true, true, xv, lp, gv) != 0) {
      *lp = -std::numeric_limits<double>::infinity();
      return step + 1;
    }
    for (Eigen::Index i = 0; i < n; ++i) pv[i] += half * gv[i];
  }
  return n_steps;
}

// Random numbers for a block of iterations: xoshiro256++ (Blackman & Vigna 2021,
// "Scrambled linear pseudorandom number generators"), its state seeded by splitmix64 from
// one 64-bit seed that the caller draws from its numpy Generator, so a chain stays
// reproducible from its seed.  Normals by Boost's ziggurat.
class block_rng {
 public:
  using result_type = uint64_t;
  explicit block_rng(uint64_t seed) {
    for (auto& word : s_) {  // splitmix64
      uint64_t z = (seed += 0x9e3779b97f4a7c15ULL);
      z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
      z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
      word = z ^ (z >> 31);
    }
  }
  static constexpr result_type min() { return 0; }
  static constexpr result_type max() { return ~result_type(0); }
  result_type operator()() {
    const uint64_t result = rotl(s_[0] + s_[3], 23) + s_[0];
    const uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = rotl(s_[3], 45);
    return result;
  }
  double normal() { return normal_(*this); }
  // Uniform on (0, 1]: never 0, so its log is finite.
  double uniform_positive() { return static_cast<double>(((*this)() >> 11) + 1) * 0x1.0p-53; }
  // Uniform on {low..high}, exactly: Lemire's multiply-and-reject (2019, "Fast random
  // integer generation in an interval"), no division on the common path.
  int uniform_int(int low, int high) {
    const uint64_t range = static_cast<uint64_t>(high - low) + 1;
    __uint128_t product = static_cast<__uint128_t>((*this)()) * range;
    if (static_cast<uint64_t>(product) < range) {
      const uint64_t threshold = (0 - range) % range;
      while (static_cast<uint64_t>(product) < threshold) {
        product = static_cast<__uint128_t>((*this)()) * range;
      }
    }
    return low + static_cast<int>(product >> 64);
  }

 private:
  static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  uint64_t s_[4];
  boost::random::normal_distribution<double> normal_;
};

// Momenta p ~ N(0, M), M = (M^-1)^-1 (Neal 2011, section 5.4.1): z standard normal and
// p = z for the identity, z / sqrt(M^-1) for a diagonal metric, and U^-1 z for a dense
// M^-1 = U'U (U upper triangular; then Cov(p) = U^-1 U^-T = M); for the low-rank kind
// S^-1 (I + V (lambda^-1/2 - 1) V') z, whose covariance is M as V is orthonormal.
class momentum_sampler {
 public:
  momentum_sampler(int metric, const double* inv_metric, int n)
      : metric_(metric), inv_metric_(inv_metric), z_(n) {
    if (metric == 1) {
      scale_ = Eigen::Map<const vector_d>(inv_metric, n).cwiseSqrt().cwiseInverse();
    } else if (metric == 2) {
      llt_.compute(Eigen::Map<const Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic,
                                                  Eigen::RowMajor>>(inv_metric, n, n));
      ok_ = llt_.info() == Eigen::Success;
    }
  }
  bool ok() const { return ok_; }
  void draw(block_rng& rng, Eigen::Ref<vector_d> p) {
    const Eigen::Index n = z_.size();
    double* pv = p.data();
    if (metric_ == 0) {
      for (Eigen::Index j = 0; j < n; ++j) pv[j] = rng.normal();
    } else if (metric_ == 1) {
      for (Eigen::Index j = 0; j < n; ++j) pv[j] = rng.normal() * scale_[j];
    } else if (metric_ == 3) {  // p = S^-1 (I + V (lambda^-1/2 - 1) V') z
      for (Eigen::Index j = 0; j < n; ++j) z_[j] = rng.normal();
      low_rank_metric(inv_metric_, n).apply(z_, p, true);
    } else {
      for (Eigen::Index j = 0; j < n; ++j) z_[j] = rng.normal();
      p = llt_.matrixU().solve(z_);
    }
  }

 private:
  int metric_;
  const double* inv_metric_;
  bool ok_ = true;
  vector_d z_, scale_;
  Eigen::LLT<Eigen::MatrixXd> llt_;
};

// One chain's HMC transitions (Neal 2011, section 5.3.2) from the state (x, grad, lp),
// shared by ahmc_hmc_block and ahmc_hmc_adapt_block.  Proposal and current state live in
// two buffers that swap on acceptance, so an iteration copies nothing but its output.
class hmc_transitions {
 public:
  hmc_transitions(const bs_model* m, int metric, const double* inv_metric, uint64_t seed,
                  double max_energy_error, const double* x, const double* grad, double lp)
      : m_(m), n_(m->param_unc_num), metric_(metric), inv_metric_(inv_metric),
        max_energy_error_(max_energy_error), momentum_(metric, inv_metric, n_), rng_(seed),
        xs_{Eigen::Map<const vector_d>(x, n_), vector_d(n_)},
        gs_{Eigen::Map<const vector_d>(grad, n_), vector_d(n_)}, p_(n_), work_(n_),
        lp_(lp) {}
  bool ok() const { return momentum_.ok(); }
  block_rng& rng() { return rng_; }
  // The next iterations draw from `seed` (as a new block of ahmc_hmc_block would).
  void reseed(uint64_t seed) { rng_ = block_rng(seed); }
  // Back to the state (x, grad, lp), the next iterations drawing from `seed`: as a new
  // block of ahmc_hmc_block from that state would.
  void restart(const double* x, const double* grad, double lp, uint64_t seed) {
    cur_ = 0;
    xs_[0] = Eigen::Map<const vector_d>(x, n_);
    gs_[0] = Eigen::Map<const vector_d>(grad, n_);
    lp_ = lp;
    reseed(seed);
  }

  // Iteration i: draws the momentum, L_r ~ Uniform{1..max_steps} (max_steps without
  // `jitter`) and u ~ Uniform(0, 1], in this order; accepts iff u < exp(-dH); writes
  // the outputs' row i.
  void step(int i, double eps, int max_steps, bool jitter, int* n_steps, double* draws,
            double* grads, double* accept_prob, int* accepted, int* divergent,
            double* energy, double* lp_out, int* n_grad) {
    momentum_.draw(rng_, p_);
    n_steps[i] = jitter ? rng_.uniform_int(1, max_steps) : max_steps;
    const double u = rng_.uniform_positive();
    const double h0 = -lp_ + kinetic_energy(metric_, inv_metric_, p_, work_);
    const int prop = 1 - cur_;
    xs_[prop] = xs_[cur_];
    gs_[prop] = gs_[cur_];
    double lp_new = lp_;
    n_grad[i] = leapfrog(m_, n_steps[i], eps, metric_, inv_metric_, xs_[prop], p_,
                         gs_[prop], &lp_new, work_);
    const double h1 = -lp_new + kinetic_energy(metric_, inv_metric_, p_, work_);
    const double delta = h1 - h0;
    const bool finite = std::isfinite(delta);
    const double ratio = finite ? std::exp(-delta) : 0.0;
    accept_prob[i] = std::min(1.0, ratio);
    divergent[i] = !finite || delta > max_energy_error_;
    accepted[i] = u < ratio;
    if (accepted[i]) {
      cur_ = prop;
      lp_ = lp_new;
    }
    energy[i] = accepted[i] ? h1 : h0;
    lp_out[i] = lp_;
    const double* xc = xs_[cur_].data();
    std::copy(xc, xc + n_, draws + static_cast<size_t>(i) * n_);
    if (grads) {
      const double* gc = gs_[cur_].data();
      std::copy(gc, gc + n_, grads + static_cast<size_t>(i) * n_);
    }
  }

  // The final state into (x, grad, lp).
  void write_state(double* x, double* grad, double* lp) const {
    std::copy(xs_[cur_].data(), xs_[cur_].data() + n_, x);
    std::copy(gs_[cur_].data(), gs_[cur_].data() + n_, grad);
    *lp = lp_;
  }

 private:
  const bs_model* m_;
  int n_, metric_;
  const double* inv_metric_;
  double max_energy_error_;
  momentum_sampler momentum_;
  block_rng rng_;
  vector_d xs_[2], gs_[2], p_, work_;
  int cur_ = 0;
  double lp_;
};

}  // namespace

extern "C" {

// Leapfrog integration of Hamiltonian dynamics for H(x, p) = -log pi(x) + p' M^-1 p / 2
// (Neal 2011, eq. 5.18-5.20): `n_steps` steps of size `eps` starting from (x, p) with
// `grad`/`lp` the log density gradient and value at x.  All four are updated in place.
// `metric` is 0 for the identity, 1 for a diagonal M^-1 given as a vector, 2 for a dense
// M^-1 given row-major.  Returns the number of gradient evaluations made; stops early and
// sets *lp = -inf when the log density or its gradient is not finite.
int ahmc_leapfrog(const bs_model* m, int n_steps, double eps, int metric,
                  const double* inv_metric, double* x, double* p, double* grad,
                  double* lp) {
  const int n = m->param_unc_num;
  vector_d velocity(n);
  return leapfrog(m, n_steps, eps, metric, inv_metric, Eigen::Map<vector_d>(x, n),
                  Eigen::Map<vector_d>(p, n), Eigen::Map<vector_d>(grad, n), lp, velocity);
}

// `n_iter` iterations of HMC (Neal 2011, section 5.3.2) from the state (x, grad, lp),
// which is updated in place.  Iteration i draws, in this order and from `seed` (block_rng
// above), the momentum p ~ N(0, M) (dims normals), its number of leapfrog steps L_r ~
// Uniform{1..L} with L = `max_steps` (AHMC, Wang et al. 2013, section 2; L_r = L when
// `jitter` is 0), written to `n_steps`, and u ~ Uniform(0, 1]; it accepts iff
// u < exp(-dH).  Per iteration it writes the state after the iteration to `draws` (row
// i), the acceptance probability min(1, exp(-dH)), whether the proposal was accepted,
// whether it diverged (dH > `max_energy_error` or not finite), the Hamiltonian and log
// density of the state kept, and the gradient evaluations made.  Proposal and current
// state live in two buffers that swap on acceptance, so an iteration copies nothing but
// its output row.  Returns 0, or 1 when a dense `inv_metric` is not positive definite.
int ahmc_hmc_block(const bs_model* m, int n_iter, double eps, int max_steps, int jitter,
                   int metric, const double* inv_metric, uint64_t seed,
                   double max_energy_error, double* x, double* grad, double* lp,
                   int* n_steps, double* draws, double* accept_prob, int* accepted,
                   int* divergent, double* energy, double* lp_out, int* n_grad) {
  hmc_transitions chain(m, metric, inv_metric, seed, max_energy_error, x, grad, *lp);
  if (!chain.ok()) return 1;
  for (int i = 0; i < n_iter; ++i) {
    chain.step(i, eps, max_steps, jitter, n_steps, draws, nullptr, accept_prob, accepted,
               divergent, energy, lp_out, n_grad);
  }
  chain.write_state(x, grad, lp);
  return 0;
}

// Stan's heuristic for a first step size (base_hmc::init_stepsize; the loop of
// initial_step_size in ahmc_stan/tuning/step_size.py): from `eps0`, double eps while
// log min(1, exp(-dH)) of one leapfrog step from (x, grad, lp) at a fresh momentum is
// above log(`target`), or halve it while it is below, stopping when it crosses or eps
// leaves (1e-7, 1e7).  Trial k is the one-step iteration of ahmc_hmc_block (L = 1, no
// jitter) from that state with `seeds[k]`, at most `n_seeds` trials.  Writes the step
// size to *eps_out and returns the trials made, or -1 when a dense `inv_metric` is not
// positive definite.
int ahmc_init_stepsize(const bs_model* m, double eps0, double target, int metric,
                       const double* inv_metric, const uint64_t* seeds, int n_seeds,
                       double max_energy_error, const double* x, const double* grad,
                       double lp, double* eps_out) {
  hmc_transitions chain(m, metric, inv_metric, 0, max_energy_error, x, grad, lp);
  if (!chain.ok()) return -1;
  std::vector<double> draw(m->param_unc_num);
  int trials = 0;
  auto log_accept = [&](double eps) {
    int n_steps, accepted, divergent, n_grad;
    double accept, energy, lp_out;
    chain.restart(x, grad, lp, seeds[trials++]);
    chain.step(0, eps, 1, false, &n_steps, draw.data(), nullptr, &accept, &accepted,
               &divergent, &energy, &lp_out, &n_grad);
    return std::log(std::max(accept, 1e-300));
  };
  const double log_target = std::log(target);
  double eps = eps0;
  const int direction = log_accept(eps) > log_target ? 1 : -1;
  for (int k = 0; k < 100 && trials < n_seeds; ++k) {
    eps = direction == 1 ? eps * 2 : eps / 2;
    if (!(1e-7 < eps && eps < 1e7)) break;
    const double h = log_accept(eps);
    if (direction == 1 && !(h > log_target)) break;
    if (direction == -1 && !(h < log_target)) break;
  }
  *eps_out = eps;
  return trials;
}

// Warmup iterations with Stan's step-size adaptation (dual averaging of log eps, Hoffman
// & Gelman 2014, Algorithm 5 with Stan's constants; the same update as
// ahmc_stan/tuning/step_size.py) inside the block, so that a whole metric window runs in
// one call.  Iteration i uses the current eps = exp(state[4]), draws, in this order, the
// momentum, L_r ~ Uniform{1..L} with L = clamp(round(path_length / eps), 1, max_steps[i])
// (L = max_steps[i] when `path_length` <= 0; L_r = L when `jitter` is 0) and u, and uses
// eps (1 + step_jitter (2v - 1)) with v ~ Uniform(0, 1] drawn first when `step_jitter`
// > 0 (Neal 2011, section 5.4.2.2), makes the HMC transition of ahmc_hmc_block, then
// updates the dual-averaging `state` = {mu, counter, s_bar, x_bar, log eps} with its
// acceptance probability towards `params` = {target, gamma, t0, kappa}.  Per iteration
// it writes what ahmc_hmc_block writes, plus the eps used and L (`num_steps_max`); `grads` (nullable) gets
// the gradient at each iteration's state (row i).  The block stops early, after the
// iteration whose update takes eps below `min_eps` (a collapsing warmup, see
// ahmc_stan/tuning/stuck.py), or after the iteration in which its gradient evaluations
// reach `max_grads`, or (when `max_divergent` > 0) after the iteration in which its
// divergent transitions reach `max_divergent`; `*n_done` is the number of iterations
// made.  Returns 0, or 1 when a dense `inv_metric` is not positive definite.
int ahmc_hmc_adapt_block(const bs_model* m, int n_iter, double path_length,
                         const int* max_steps, double max_grads, int max_divergent,
                         int jitter, double step_jitter, int metric,
                         const double* inv_metric, uint64_t seed,
                         double max_energy_error, double min_eps, double* state,
                         const double* params, double* x, double* grad, double* lp,
                         int* n_done, double* step_size, int* num_steps_max, int* n_steps,
                         double* draws, double* grads, double* accept_prob, int* accepted,
                         int* divergent, double* energy, double* lp_out, int* n_grad) {
  hmc_transitions chain(m, metric, inv_metric, seed, max_energy_error, x, grad, *lp);
  if (!chain.ok()) return 1;
  const double target = params[0], gamma = params[1], t0 = params[2], kappa = params[3];
  double &mu = state[0], &counter = state[1], &s_bar = state[2], &x_bar = state[3],
         &log_eps = state[4];
  *n_done = 0;
  double made = 0;  // gradient evaluations
  int diverged = 0;
  for (int i = 0; i < n_iter; ++i) {
    const double eps = std::exp(log_eps);
    const int cap = max_steps[i];
    const double steps = path_length > 0 ? std::round(path_length / eps) : cap;
    const int max_l = steps < 1 ? 1 : steps > cap ? cap : static_cast<int>(steps);
    num_steps_max[i] = max_l;
    step_size[i] = step_jitter > 0
        ? eps * (1 + step_jitter * (2 * chain.rng().uniform_positive() - 1)) : eps;
    chain.step(i, step_size[i], max_l, jitter, n_steps, draws, grads, accept_prob, accepted,
               divergent, energy, lp_out, n_grad);
    counter += 1;  // dual averaging of log eps
    const double eta = 1.0 / (counter + t0);
    s_bar = (1 - eta) * s_bar + eta * (target - accept_prob[i]);
    log_eps = mu - s_bar * std::sqrt(counter) / gamma;
    const double x_eta = std::pow(counter, -kappa);
    x_bar = (1 - x_eta) * x_bar + x_eta * log_eps;
    *n_done = i + 1;
    made += n_grad[i];
    diverged += divergent[i] != 0;
    if (!(std::exp(log_eps) >= min_eps) || made >= max_grads ||
        (max_divergent > 0 && diverged >= max_divergent))
      break;
  }
  chain.write_state(x, grad, lp);
  return 0;
}

}  // extern "C"

// =======================================================================================
// Algorithm 2 of AHMC in one call: blocks of HMC iterations at the tuner's gamma = (eps,
// L), each block's reward ESJD / sqrt(L) handed to the tuner (ahmc_tuner.hpp), which
// moves gamma between blocks.

namespace {

// ||dx||^2_M = dx' M dx for the inverse metric kinds of apply_inv_metric (M = (M^-1)^-1;
// for a dense M^-1 = L L', ||L^-1 dx||^2; for the low-rank kind ||(I + V C V') S^-1 dx||^2
// with C = Lambda^-1/2 - 1, as (I + V C V')^2 = I + V (Lambda^-1 - 1) V').  The norm of
// ahmc_stan/metric.py's squared_jumps.
class metric_norm {
 public:
  metric_norm(int metric, const double* inv_metric, Eigen::Index n)
      : metric_(metric), inv_metric_(inv_metric), work_(n) {
    if (metric == 2) {
      llt_.compute(Eigen::Map<const Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic,
                                                  Eigen::RowMajor>>(inv_metric, n, n));
    }
  }
  double squared(const Eigen::Ref<const vector_d>& dx) {
    const Eigen::Index n = dx.size();
    if (metric_ == 0) return dx.squaredNorm();
    if (metric_ == 1) {
      double sum = 0;
      for (Eigen::Index i = 0; i < n; ++i) sum += dx[i] * dx[i] / inv_metric_[i];
      return sum;
    }
    if (metric_ == 2) {
      work_ = llt_.matrixL().solve(dx);
      return work_.squaredNorm();
    }
    low_rank_metric(inv_metric_, n).whiten(dx, work_);
    return work_.squaredNorm();
  }

 private:
  int metric_;
  const double* inv_metric_;
  vector_d work_;
  Eigen::LLT<Eigen::MatrixXd> llt_;
};

uint64_t mix64(uint64_t z) {  // splitmix64's output function
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// Algorithm 2's loop (ahmc_tuned_hmc_block describes it) over any `chain` with
// reseed(seed) and step(i, eps, L), which makes iteration i at step size eps with L_r ~
// Uniform{1..L}, writes its state to row i of `draws` and returns its gradient
// evaluations.  Returns 0, or 2 at a non-finite reward; `*n_done`: iterations made.
template <class Chain>
int tuned_blocks(Chain& chain, ahmc_tuner::bo_tuner* t, int block_size, int n_iter,
                 double max_grads, metric_norm& norm, uint64_t seed, const double* x,
                 Eigen::Index n, double* draws, double* step_size, int* num_steps_max,
                 int* n_done) {
  const uint64_t golden = 0x9e3779b97f4a7c15ULL;
  vector_d previous = Eigen::Map<const vector_d>(x, n), gamma(t->ndim());
  double grads = 0;
  int status = 0, i = 0;
  for (uint64_t b = 0; i < n_iter && grads < max_grads; ++b) {
    gamma = t->current();
    const double eps = gamma[0];
    const int steps = static_cast<int>(gamma[1]);
    chain.reseed(mix64(seed + (2 * b + 1) * golden));
    const int end = std::min(n_iter, i + block_size), start = i;
    double jumps = 0;
    for (; i < end; ++i) {
      grads += chain.step(i, eps, steps);
      step_size[i] = eps;
      num_steps_max[i] = steps;
      const Eigen::Map<const vector_d> row(draws + static_cast<size_t>(i) * n, n);
      jumps += norm.squared(row - previous);
      previous = row;
    }
    if (t->frozen()) continue;
    const double reward = jumps / (end - start) / std::sqrt(static_cast<double>(steps));
    const double u = static_cast<double>(mix64(seed + (2 * b + 2) * golden) >> 11) * 0x1.0p-53;
    if (!t->update(gamma.data(), reward, u)) {
      status = 2;
      break;
    }
  }
  *n_done = i;
  return status;
}

}  // namespace

extern "C" {

// The tuner (ahmc_tuner::bo_tuner) over a box of `ndim` dimensions with bounds `low` and
// `width` (integer dimensions flagged), the candidate grid (`n_grid` rows, in unit-cube
// and in box coordinates, row-major), `config` = {kappa, noise_var, signal_var, alpha
// (NaN: no scale), delta, k, lambda, schedule (0 AHMC, 1 exponential), refresh_every,
// maximizer (0 grid, 1 DIRECT: no grid rows), DIRECT's evaluations per move} and the
// initial gamma (box units).  Freed by ahmc_bo_free.
void* ahmc_bo_new(int ndim, const double* low, const double* width, const int* integer,
                  int n_grid, const double* grid_unit, const double* grid_box,
                  const double* config, const double* initial) {
  try {
    return new ahmc_tuner::bo_tuner(ndim, low, width, integer, n_grid, grid_unit, grid_box,
                                    config, initial);
  } catch (...) {
    return nullptr;
  }
}

void ahmc_bo_free(void* tuner) { delete static_cast<ahmc_tuner::bo_tuner*>(tuner); }

// `n` rewards of consecutive blocks run at `gamma`, with the uniforms that decide the
// moves (BayesOptTuner.update_many).  Returns 0, or 1 at a non-finite reward (the
// rewards before it are taken).
int ahmc_bo_update(void* tuner, const double* gamma, int n, const double* rewards,
                   const double* uniforms) {
  auto* t = static_cast<ahmc_tuner::bo_tuner*>(tuner);
  for (int j = 0; j < n; ++j) {
    if (!t->update(gamma, rewards[j], uniforms[j])) return 1;
  }
  return 0;
}

// {i, s, r_max, frozen, distinct inputs, history rows, seconds in updates} and the
// current gamma.
void ahmc_bo_state(void* tuner, double* state, double* current) {
  auto* t = static_cast<ahmc_tuner::bo_tuner*>(tuner);
  state[0] = t->i();
  state[1] = t->s();
  state[2] = t->r_max();
  state[3] = t->frozen();
  state[4] = t->n_unique();
  state[5] = static_cast<double>(t->history().size())
             / ahmc_tuner::history_columns(t->ndim());
  state[6] = t->seconds();
  std::copy(t->current().data(), t->current().data() + t->ndim(), current);
}

// History rows `start`.. (ahmc_tuner::history_columns each) into `out`.
void ahmc_bo_history(void* tuner, int start, int n_rows, double* out) {
  auto* t = static_cast<ahmc_tuner::bo_tuner*>(tuner);
  const size_t cols = ahmc_tuner::history_columns(t->ndim());
  std::copy(t->history().begin() + start * cols, t->history().begin() + (start + n_rows) * cols,
            out);
}

// Sets the current gamma (box units) and whether the tuner is frozen (a frozen tuner
// takes no rewards in ahmc_tuned_hmc_block and does not move in ahmc_bo_update).
void ahmc_bo_set(void* tuner, const double* current, int frozen) {
  auto* t = static_cast<ahmc_tuner::bo_tuner*>(tuner);
  t->set_current(current);
  t->set_frozen(frozen != 0);
}

// The GP's posterior mean and variance on the candidate grid (the carried posterior the
// tuner's moves use).
void ahmc_bo_predict(void* tuner, double* mean, double* var) {
  Eigen::VectorXd mu, v;
  static_cast<ahmc_tuner::bo_tuner*>(tuner)->gp().predict_grid(mu, v);
  std::copy(mu.data(), mu.data() + mu.size(), mean);
  std::copy(v.data(), v.data() + v.size(), var);
}

// DIRECT (ahmc_tuner::direct_minimise) on f over [0, 1]^d with `maxfun` evaluations and
// the other options at their defaults; the best point goes to `x`.  Returns the number of
// evaluations.  The tuner's moves call direct_minimise directly; this entry point lets
// it be checked on known functions.
int ahmc_direct_minimise(int d, double (*f)(const double*, void*), void* data, int maxfun,
                         double* x) {
  int n_eval = 0;
  ahmc_tuner::direct_options options;
  options.maxfun = maxfun;
  const std::vector<double> best = ahmc_tuner::direct_minimise(
      d, [&](const double* u) { ++n_eval; return f(u, data); }, options);
  std::copy(best.begin(), best.end(), x);
  return n_eval;
}

// Up to `n_iter` AHMC iterations (Wang, Mohamed & de Freitas 2013, Algorithm 2) from the
// state (x, grad, lp), updated in place: blocks of `block_size` iterations (the last may
// be shorter) at the tuner's gamma = (eps, L), L_r ~ Uniform{1..L} per iteration; after
// each block, unless the tuner is frozen, its reward ESJD / sqrt(L) (the mean of
// ||x_t - x_{t-1}||^2_M over the block, the first jump from the state before it) goes to
// the tuner with a uniform.  Block b of the call draws its momenta, L_r and Metropolis
// uniforms as ahmc_hmc_block does from the seed mix64(seed + (2b + 1) G), and the tuner's
// uniform is mix64(seed + (2b + 2) G) / 2^64 (G = 0x9e3779b97f4a7c15), so one block is
// reproducible alone.  The call stops after the block in which its gradient evaluations
// reach `max_grads`.  Per iteration it writes what ahmc_hmc_block writes, plus eps
// (`step_size`) and L (`num_steps_max`); `*n_done` is the number of iterations made.
// Returns 0; 1 when a dense `inv_metric` is not positive definite; 2 at a non-finite
// reward (the iterations made are written).
int ahmc_tuned_hmc_block(const bs_model* m, void* tuner, int block_size, int n_iter,
                         double max_grads, int metric, const double* inv_metric,
                         uint64_t seed, double max_energy_error, double* x, double* grad,
                         double* lp, int* n_done, double* step_size, int* num_steps_max,
                         int* n_steps, double* draws, double* accept_prob, int* accepted,
                         int* divergent, double* energy, double* lp_out, int* n_grad) {
  const Eigen::Index n = m->param_unc_num;
  hmc_transitions chain(m, metric, inv_metric, seed, max_energy_error, x, grad, *lp);
  if (!chain.ok()) return 1;
  struct {
    hmc_transitions& chain;
    int *n_steps, *accepted, *divergent, *n_grad;
    double *draws, *accept_prob, *energy, *lp_out;
    void reseed(uint64_t seed) { chain.reseed(seed); }
    int step(int i, double eps, int steps) {
      chain.step(i, eps, steps, true, n_steps, draws, nullptr, accept_prob, accepted,
                 divergent, energy, lp_out, n_grad);
      return n_grad[i];
    }
  } steps{chain, n_steps, accepted, divergent, n_grad, draws, accept_prob, energy, lp_out};
  metric_norm norm(metric, inv_metric, n);
  const int status = tuned_blocks(steps, static_cast<ahmc_tuner::bo_tuner*>(tuner),
                                  block_size, n_iter, max_grads, norm, seed, x, n, draws,
                                  step_size, num_steps_max, n_done);
  chain.write_state(x, grad, lp);
  return status;
}

}  // extern "C"

namespace {

// The adaptive Stoermer-Verlet integrator of SVHMC on (x, p, rho) (Alfaki, Subbey &
// Haugland 2008, made exact with rho as an auxiliary variable: ahmc_stan/samplers/svhmc.py,
// AdaptiveVerlet, whose Python is the reference for every operation here), for an identity
// (`metric` 0) or diagonal (1) inverse metric.  `options` = {G_ref, a, s, method}:
// U = (G/G_ref)^a with G = g'M^-1 g + w'M^-1 w, w = H M^-1 p, and q(rho | x, p) =
// N(U, (sU)^2).  The Hessian-vector product is autodiff's (method 0) or a central
// difference of two gradients (1: GradientDifferenceHV, odd in v to the last bit, so
// U(x, -p) = U(x, p) and the sampler stays exact).
class adaptive_verlet {
 public:
  adaptive_verlet(const bs_model* m, int metric, const double* inv_metric,
                  const double* options)
      : m_(m), metric_(metric), inv_metric_(inv_metric), reference_(options[0]),
        exponent_(options[1]), rho_sd_(options[2]), differences_(options[3] == 1),
        v_(m->param_unc_num), w_(m->param_unc_num), g_half_(m->param_unc_num),
        shifted_(m->param_unc_num), g_other_(m->param_unc_num) {}

  // U(x, p) with g the gradient at x, adding its evaluations to the counts; NaN where
  // the product fails or is not finite.
  double u(const vector_d& x, const vector_d& p, const vector_d& g, int* n_grad,
           int* n_hvp) {
    const double nan = std::numeric_limits<double>::quiet_NaN();
    apply_inv_metric(metric_, inv_metric_, p, v_);
    if (differences_) {  // (g(x + hv) - g(x - hv)) / 2h, h = sqrt(eps)(1 + |x|_inf)/|v|_inf
      *n_grad += 2;
      const double scale = v_.cwiseAbs().maxCoeff();
      if (scale == 0) {
        w_.setZero();
      } else {
        const double h = std::sqrt(std::numeric_limits<double>::epsilon())
                         * (1.0 + x.cwiseAbs().maxCoeff()) / scale;
        double lp;
        shifted_ = x + h * v_;
        if (ahmc_log_density_gradient(m_, true, true, shifted_.data(), &lp, w_.data()) != 0)
          return nan;
        shifted_ = x - h * v_;
        if (ahmc_log_density_gradient(m_, true, true, shifted_.data(), &lp,
                                      g_other_.data()) != 0)
          return nan;
        w_ -= g_other_;
        w_ /= 2.0 * h;
      }
    } else {
      *n_hvp += 1;
      try {
        ensure_ad_tape();
        double lp;
        model_hessian_times_vector(*m_->model, true, true, x, v_, lp, w_);
      } catch (...) {
        return nan;
      }
    }
    if (!w_.allFinite()) return nan;
    return std::pow((quad(g) + quad(w_)) / reference_, exponent_);
  }

  // log N(rho; U, (sU)^2) up to a constant.
  double log_q(double rho, double u) const {
    const double z = (rho - u) / (rho_sd_ * u);
    return -0.5 * z * z - std::log(std::abs(u));
  }

  // One trajectory from (x, p, grad, lp), updated in place: rho_0 = U (1 + s z) with
  // `rho_noise` = z, `n_steps` steps, and the log weight log q(rho_L | end) - log q(rho_0 |
  // start).  Returns the log density at the end (-inf when a value is not finite or some
  // rho <= 0, the weight then -inf); adds the gradients and products made to the counts.
  double trajectory(int n_steps, double eps, double rho_noise, vector_d& x, vector_d& p,
                    vector_d& grad, double lp, double* log_w, int* n_grad, int* n_hvp) {
    const double inf = std::numeric_limits<double>::infinity();
    *log_w = -inf;
    const double u0 = u(x, p, grad, n_grad, n_hvp);
    if (!std::isfinite(u0)) return -inf;
    const double rho0 = u0 * (1.0 + rho_sd_ * rho_noise);
    if (!(rho0 > 0)) return -inf;
    double rho = rho0;
    for (int step = 0; step < n_steps; ++step) {
      double h = 0.5 * eps / rho;
      p += h * grad;
      drift(h, p, x);
      double lp_half;
      *n_grad += 1;
      if (ahmc_log_density_gradient(m_, true, true, x.data(), &lp_half, g_half_.data()) != 0)
        return -inf;
      rho = 2.0 * u(x, p, g_half_, n_grad, n_hvp) - rho;
      if (!(rho > 0 && std::isfinite(rho))) return -inf;
      h = 0.5 * eps / rho;
      drift(h, p, x);
      *n_grad += 1;
      if (ahmc_log_density_gradient(m_, true, true, x.data(), &lp, grad.data()) != 0)
        return -inf;
      p += h * grad;
    }
    const double u_end = u(x, p, grad, n_grad, n_hvp);
    if (std::isfinite(u_end)) *log_w = log_q(rho, u_end) - log_q(rho0, u0);
    return lp;
  }

 private:
  double quad(const vector_d& v) const {  // v' M^-1 v
    if (metric_ == 0) return v.dot(v);
    return v.dot(Eigen::Map<const vector_d>(inv_metric_, v.size()).cwiseProduct(v));
  }
  void drift(double h, const vector_d& p, vector_d& x) const {  // x += h M^-1 p
    if (metric_ == 0) {
      x += h * p;
    } else {
      x += h * Eigen::Map<const vector_d>(inv_metric_, p.size()).cwiseProduct(p);
    }
  }

  const bs_model* m_;
  int metric_;
  const double* inv_metric_;
  double reference_, exponent_, rho_sd_;
  bool differences_;
  vector_d v_, w_, g_half_, shifted_, g_other_;
};

// Generalised HMC's transitions (ahmc_ghmc_block describes them) from the state (x,
// grad, lp, p), shared by ahmc_ghmc_block and ahmc_tuned_ghmc_block.
class ghmc_transitions {
 public:
  ghmc_transitions(const bs_model* m, int metric, const double* inv_metric,
                   int num_candidates, const double* verlet, uint64_t seed,
                   double max_energy_error, const double* x, const double* grad, double lp,
                   const double* p)
      : m_(m), n_(m->param_unc_num), k_(num_candidates), metric_(metric),
        inv_metric_(inv_metric), max_energy_error_(max_energy_error), rng_(seed),
        xc_(Eigen::Map<const vector_d>(x, n_)), gc_(Eigen::Map<const vector_d>(grad, n_)),
        pc_(Eigen::Map<const vector_d>(p, n_)), xn_(n_), gn_(n_), pn_(n_), work_(n_),
        cand_(static_cast<size_t>(k_ > 0 ? k_ : 1) * n_), column_(k_ + 1), lpc_(lp) {
    if (verlet) sv_ = std::make_unique<adaptive_verlet>(m, metric, inv_metric, verlet);
  }
  void reseed(uint64_t seed) { rng_ = block_rng(seed); }

  // Iteration i: writes row i of the outputs (`n_hvp` nullable); `noise` (nullable)
  // gets the iteration's random numbers and is advanced past them.
  void step(int i, double eps, int max_steps, bool jitter, int* n_steps, double* draws,
            double* accept_prob, int* accepted, int* divergent, double* energy,
            double* lp_out, int* n_grad, int* n_hvp, double*& noise) {
    const int n = n_, k = k_;
    n_steps[i] = jitter ? rng_.uniform_int(1, max_steps) : max_steps;
    for (double& c : cand_) c = rng_.normal();
    for (int j = 0; j < n; ++j) {
      if (k == 0) {  // a fresh momentum
        pc_[j] = metric_ == 1 ? cand_[j] / std::sqrt(inv_metric_[j]) : cand_[j];
        continue;
      }
      const double sd = metric_ == 1 ? 1.0 / std::sqrt(inv_metric_[j]) : 1.0;
      const double z = pc_[j] / sd;  // p*_j = -OR(p)_j
      int below = 0;
      for (int c = 0; c < k; ++c) {
        column_[c] = cand_[static_cast<size_t>(c) * n + j];
        below += column_[c] < z;
      }
      column_[k] = z;
      std::nth_element(column_.begin(), column_.begin() + (k - below), column_.end());
      pc_[j] = -column_[k - below] * sd;
    }
    const double rho_noise = sv_ ? rng_.normal() : 0.0;
    const double u = rng_.uniform_positive();
    if (noise) {
      noise[0] = n_steps[i];
      std::copy(cand_.begin(), cand_.end(), noise + 1);
      noise += cand_.size() + 1;
      if (sv_) *noise++ = rho_noise;
      *noise++ = u;
    }
    const double h0 = -lpc_ + kinetic_energy(metric_, inv_metric_, pc_, work_);
    xn_ = xc_;
    pn_ = pc_;
    gn_ = gc_;
    double lpn = lpc_, log_w = 0.0;
    int hvps = 0;
    if (sv_) {
      n_grad[i] = 0;
      lpn = sv_->trajectory(n_steps[i], eps, rho_noise, xn_, pn_, gn_, lpc_, &log_w,
                            &n_grad[i], &hvps);
    } else {
      n_grad[i] = leapfrog(m_, n_steps[i], eps, metric_, inv_metric_, xn_, pn_, gn_, &lpn,
                           work_);
    }
    if (n_hvp) n_hvp[i] = hvps;
    const double h1 = -lpn + kinetic_energy(metric_, inv_metric_, pn_, work_);
    const double log_ratio = h0 - h1 + log_w;
    const bool finite = std::isfinite(log_ratio);
    accept_prob[i] = finite ? std::exp(std::min(0.0, log_ratio)) : 0.0;
    divergent[i] = !finite || h1 - h0 > max_energy_error_;
    accepted[i] = finite && std::log(u) < log_ratio;
    if (accepted[i]) {
      xc_.swap(xn_);
      gc_.swap(gn_);
      pc_.swap(pn_);
      lpc_ = lpn;
      energy[i] = h1;
    } else {
      pc_ = -pc_;  // the momentum flip on rejection
      energy[i] = h0;
    }
    std::copy(xc_.data(), xc_.data() + n, draws + static_cast<size_t>(i) * n);
    lp_out[i] = lpc_;
  }

  void write_state(double* x, double* grad, double* lp, double* p) const {
    std::copy(xc_.data(), xc_.data() + n_, x);
    std::copy(gc_.data(), gc_.data() + n_, grad);
    std::copy(pc_.data(), pc_.data() + n_, p);
    *lp = lpc_;
  }

 private:
  const bs_model* m_;
  int n_, k_, metric_;
  const double* inv_metric_;
  double max_energy_error_;
  block_rng rng_;
  vector_d xc_, gc_, pc_, xn_, gn_, pn_, work_;
  std::vector<double> cand_, column_;
  std::unique_ptr<adaptive_verlet> sv_;
  double lpc_;
};

}  // namespace

extern "C" {

// `n_iter` iterations of generalised HMC (ahmc_stan/ghmc.py, GHMCKernel.run, whose Python
// loop is the reference) from (x, grad, lp, p), all updated in place; identity (`metric`
// 0) or diagonal (1) inverse metric.  The momentum update is Neal's ordered
// overrelaxation with K = `num_candidates` (ahmc_stan/momentum.py; OHMC, OSVHMC), or with
// K = 0 a fresh draw from N(0, M) (SVHMC).  The integrator is the leapfrog, or with
// `verlet` = {G_ref, a, s, method} (nullable) SVHMC's adaptive Stoermer-Verlet
// (adaptive_verlet).
// Iteration i draws, in this order and from `seed`: L_r ~ Uniform{1..max_steps}
// (max_steps without `jitter`); the K x n candidates of the overrelaxation (k-major), or
// the n normals of a fresh momentum; with `verlet`, the normal of rho_0; and
// u ~ Uniform(0, 1].  The overrelaxation sets p* = -OR(p) (per component: r = the
// candidates below p_j / sd_j, take the value of rank K - r among the K + 1).  The
// proposal is accepted iff log u < -dH + log w (w: the integrator's auxiliary weight, 1
// for the leapfrog); a non-finite ratio rejects and is divergent, as is dH >
// `max_energy_error`; a rejection flips the momentum.  Per iteration it writes what
// ahmc_hmc_block writes, and `n_hvp` (nullable) the Hessian-vector products; `noise`
// (nullable) gets L_r, the normals, rho_0's normal (with `verlet`) and u, for tests.
// Returns 0, or 1 for a metric other than the identity or a diagonal.
int ahmc_ghmc_block(const bs_model* m, int n_iter, double eps, int max_steps, int jitter,
                    int metric, const double* inv_metric, int num_candidates,
                    const double* verlet, uint64_t seed, double max_energy_error,
                    double* x, double* grad, double* lp, double* p, int* n_steps,
                    double* draws, double* accept_prob, int* accepted, int* divergent,
                    double* energy, double* lp_out, int* n_grad, int* n_hvp,
                    double* noise) {
  if (metric != 0 && metric != 1) return 1;
  ghmc_transitions chain(m, metric, inv_metric, num_candidates, verlet, seed,
                         max_energy_error, x, grad, *lp, p);
  for (int i = 0; i < n_iter; ++i) {
    chain.step(i, eps, max_steps, jitter, n_steps, draws, accept_prob, accepted, divergent,
               energy, lp_out, n_grad, n_hvp, noise);
  }
  chain.write_state(x, grad, lp, p);
  return 0;
}

// AHMC's Algorithm 2 (ahmc_tuned_hmc_block) over generalised HMC (ahmc_ghmc_block): the
// blocks' iterations are ahmc_ghmc_block's, block b from the seed ahmc_tuned_hmc_block
// derives for it, the momentum carried from block to block; the arguments are
// ahmc_ghmc_block's and ahmc_tuned_hmc_block's.  Returns 0; 1 for a metric other than
// the identity or a diagonal; 2 at a non-finite reward.
int ahmc_tuned_ghmc_block(const bs_model* m, void* tuner, int block_size, int n_iter,
                          double max_grads, int metric, const double* inv_metric,
                          int num_candidates, const double* verlet, uint64_t seed,
                          double max_energy_error, double* x, double* grad, double* lp,
                          double* p, int* n_done, double* step_size, int* num_steps_max,
                          int* n_steps, double* draws, double* accept_prob, int* accepted,
                          int* divergent, double* energy, double* lp_out, int* n_grad,
                          int* n_hvp) {
  if (metric != 0 && metric != 1) return 1;
  const Eigen::Index n = m->param_unc_num;
  ghmc_transitions chain(m, metric, inv_metric, num_candidates, verlet, seed,
                         max_energy_error, x, grad, *lp, p);
  struct {
    ghmc_transitions& chain;
    int *n_steps, *accepted, *divergent, *n_grad, *n_hvp;
    double *draws, *accept_prob, *energy, *lp_out;
    void reseed(uint64_t seed) { chain.reseed(seed); }
    int step(int i, double eps, int steps) {
      double* no_noise = nullptr;
      chain.step(i, eps, steps, true, n_steps, draws, accept_prob, accepted, divergent,
                 energy, lp_out, n_grad, n_hvp, no_noise);
      return n_grad[i];
    }
  } steps{chain, n_steps, accepted, divergent, n_grad, n_hvp, draws, accept_prob, energy,
          lp_out};
  metric_norm norm(metric, inv_metric, n);
  const int status = tuned_blocks(steps, static_cast<ahmc_tuner::bo_tuner*>(tuner),
                                  block_size, n_iter, max_grads, norm, seed, x, n, draws,
                                  step_size, num_steps_max, n_done);
  chain.write_state(x, grad, lp, p);
  return status;
}

// `n` momenta (rows of `out`) from N(0, M) drawn as ahmc_hmc_block draws them (for
// tests of the generator).  Returns 0, or 1 when a dense `inv_metric` is not positive
// definite.
int ahmc_draw_momenta(int metric, const double* inv_metric, int dims, uint64_t seed, int n,
                      double* out) {
  momentum_sampler momentum(metric, inv_metric, dims);
  if (!momentum.ok()) return 1;
  block_rng rng(seed);
  vector_d p(dims);
  for (int i = 0; i < n; ++i) {
    momentum.draw(rng, p);
    std::copy(p.data(), p.data() + dims, out + static_cast<size_t>(i) * dims);
  }
  return 0;
}

}  // extern "C"

// ---------------------------------------------------------------------------------------
// Metropolis-Hastings blocks for the samplers of ahmc_stan/samplers/metropolis.py (rwm,
// mala, am, gadrwm, gadmala, gadmala_exact; Titsias & Dellaportas 2019), whole blocks of
// iterations with their warmup adaptation in one call.  The Python implementation of one
// iteration (metropolis.mh_iteration and the proposals' `adapt`) is the reference these
// follow step by step; tests compare the two for a fixed noise.

namespace {

using lower_matrix = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

// Log density (Jacobian included, constants dropped) without gradient; -inf where the
// model throws or it is not finite.
double log_density_only(const bs_model* m, const vector_d& x) {
  try {
    ensure_ad_tape();
    stan::math::nested_rev_autodiff nested;
    vector_t<var> xv = x.cast<var>();
    const double lp = log_prob(*m->model, true, true, xv, print_stream).val();
    return std::isfinite(lp) ? lp : -std::numeric_limits<double>::infinity();
  } catch (...) {
    return -std::numeric_limits<double>::infinity();
  }
}

// One chain of MH iterations with a Gaussian proposal of Cholesky factor L (a scalar
// sigma, or lower triangular), random walk or Langevin (metropolis.propose), and the
// warmup adaptation `adapt`: 0 none, 1 dual averaging of log sigma (rwm, mala; state
// {mu, counter, s_bar, x_bar, log sigma, sigma}, params as dual_averaging's), 2
// Algorithm 1 of Titsias & Dellaportas (gad.GadProposal: RMSProp on L, the beta update),
// 3 adaptive Metropolis (baselines.AdaptiveMetropolis: running mean, rank-one Cholesky
// updates, dual-averaged global scale).  `am` selects AM's proposal
// y = x + lambda sqrt(s_d) (L eps1 + sqrt(delta) eps2), lambda = state[1], with 2n normals.
class mh_chain {
 public:
  enum { NONE = 0, SCALE = 1, GAD = 2, AM = 3 };

  mh_chain(const bs_model* m, int adapt, bool langevin, bool exact, bool am, bool dense,
           const double* params, double* state, double* chol, double* sq_grad,
           double* mean, const double* x, const double* grad, double lp)
      : m_(m), n_(m->param_unc_num), adapt_(adapt), langevin_(langevin), exact_(exact),
        am_(am), dense_(dense), params_(params), state_(state), chol_(chol, dense ? n_ : 0, n_),
        sq_grad_(sq_grad, sq_grad ? n_ : 0, n_), mean_(mean), x_(Eigen::Map<const vector_d>(x, n_)),
        gx_(Eigen::Map<const vector_d>(grad, n_)), lp_(lp),
        eps_(am ? 2 * n_ : n_), y_(n_), gy_(n_), a_(n_), ux_(n_), uy_(n_),
        tmp_(n_), c_(n_), hv_(n_), w_exact_a_(n_), row_grad_(n_) {
    // AM adapts L by rank-one updates, column by column: on a column-major copy for the
    // block (contiguous columns), written back by write_state.
    if (am_ && adapt_ == AM) {
      am_l_.resize(n_, n_);
      am_l_.triangularView<Eigen::Lower>() = chol_;
    }
  }

  int noise_dims() const { return static_cast<int>(eps_.size()); }

  // The scale sigma (adapt 0/1) or the AM scale lambda; nan for a dense L.
  double step_size() const {
    if (am_) return state_[1];
    return dense_ ? std::numeric_limits<double>::quiet_NaN() : state_[5];
  }
  double beta() const { return adapt_ == GAD ? state_[0] : std::numeric_limits<double>::quiet_NaN(); }

  // One iteration from the noise (eps, log_u); `adapting` runs the adaptation.  Adds its
  // evaluations to the counts and returns min(1, ratio) in *prob and acceptance.
  bool step(bool adapting, double log_u, double* prob, double* n_grad, double* n_density,
            double* n_hvp) {
    propose();
    const bool need_grad = langevin_ || (adapting && adapt_ == GAD);
    double lp_y;
    if (need_grad) {
      if (ahmc_log_density_gradient(m_, true, true, y_.data(), &lp_y, gy_.data())) {
        lp_y = -std::numeric_limits<double>::infinity();
      }
      *n_grad += 1;
    } else {
      lp_y = log_density_only(m_, y_);
      *n_density += 1;
    }
    double log_ratio = lp_y - lp_;
    if (std::isfinite(lp_y) && langevin_) {  // log q(x|y) - log q(y|x), section 2.3
      auto e = eps_.head(n_);  // r = eps + L'(g_x + g_y)/2, L'g_x from propose()
      times_lt(gy_, uy_);
      c_ = e + 0.5 * (ux_ + uy_);
      log_ratio += 0.5 * (e.squaredNorm() - c_.squaredNorm());
    }
    *prob = std::isnan(log_ratio) ? 0.0 : log_ratio >= 0 ? 1.0 : std::exp(log_ratio);
    const bool accepted = log_u < log_ratio;
    if (adapting) {
      if (adapt_ == SCALE) {
        dual_averaging(state_, *prob);
        state_[5] = std::exp(state_[4]);
      } else if (adapt_ == GAD) {
        gad_adapt(lp_y, log_ratio, accepted, n_hvp);
      } else if (adapt_ == AM) {
        am_adapt(accepted ? y_ : x_, *prob);
      }
    }
    if (accepted) {
      x_.swap(y_);
      lp_ = lp_y;
      if (langevin_) {
        gx_.swap(gy_);
        ux_.swap(uy_);
      }
    }
    // L'g_x carries over to the next iteration while L is fixed
    ux_current_ = langevin_ && adapt_ == NONE;
    return accepted;
  }

  vector_d& eps() { return eps_; }
  const vector_d& x() const { return x_; }
  double lp() const { return lp_; }
  void write_state(double* x, double* grad, double* lp) {
    if (am_l_.size()) chol_.triangularView<Eigen::Lower>() = am_l_;
    std::copy(x_.data(), x_.data() + n_, x);
    std::copy(gx_.data(), gx_.data() + n_, grad);
    *lp = lp_;
  }

 private:
  // out = L v, out = L' v (L = sigma I, lower triangular, or AM's lambda sqrt(s_d) L).
  // The dense products are ahmc_triangular.hpp's.
  void times_l(const vector_d& v, vector_d& out) const {
    if (dense_) ahmc_triangular::lower_times(chol_, v.data(), out.data());
    else out = state_[5] * v;
  }
  void times_lt(const vector_d& v, vector_d& out) const {
    if (dense_) ahmc_triangular::lower_transpose_times(chol_, v.data(), out.data());
    else out = state_[5] * v;
  }

  // metropolis.propose, and AM's y = x + lambda sqrt(s_d) (L eps1 + sqrt(delta) eps2).
  void propose() {
    const auto e = eps_.head(n_);
    if (am_) {
      const double lam = state_[1], s_d = params_[4], delta = params_[3];
      if (am_l_.size()) tmp_.noalias() = am_l_.triangularView<Eigen::Lower>() * e;  // L eps1
      else ahmc_triangular::lower_times(chol_, eps_.data(), tmp_.data());
      y_ = x_ + lam * std::sqrt(s_d) * (tmp_ + std::sqrt(delta) * eps_.tail(n_));
      return;
    }
    if (langevin_) {  // y = x + L(L' g / 2 + eps)
      if (!ux_current_) times_lt(gx_, ux_);
      a_ = e + 0.5 * ux_;
      times_l(a_, tmp_);
    } else {
      times_l(eps_, tmp_);  // eps_ holds n normals here (2n for AM only)
    }
    y_ = x_ + tmp_;
  }

  // tuning/step_size.DualAveraging.update on s = {mu, counter, s_bar, x_bar, log eps}
  // with params {target, gamma, t0, kappa} at params_ + offset.
  void dual_averaging(double* s, double accept_stat, int offset = 0) const {
    const double target = params_[offset], gamma = params_[offset + 1],
                 t0 = params_[offset + 2], kappa = params_[offset + 3];
    accept_stat = std::isfinite(accept_stat) ? std::min(1.0, accept_stat) : 0.0;
    s[1] += 1;
    const double eta = 1.0 / (s[1] + t0);
    s[2] = (1 - eta) * s[2] + eta * (target - accept_stat);
    s[4] = s[0] - s[2] * std::sqrt(s[1]) / gamma;
    const double x_eta = std::pow(s[1], -kappa);
    s[3] = (1 - x_eta) * s[3] + x_eta * s[4];
  }

  // gad.GadProposal.adapt: params {alpha*, eta, rho_beta, min_diag_ratio, min_beta},
  // state {beta}.  The gradient of F (gad.objective_gradient), lower triangle only, then
  // the RMSProp step with the diagonal guard, then the beta update.
  void gad_adapt(double lp_y, double log_ratio, bool accepted, double* n_hvp) {
    double& beta = state_[0];
    const double alpha = params_[0], rate = params_[1], rho = params_[2],
                 min_ratio = params_[3], min_beta = params_[4];
    if (std::isfinite(lp_y)) {
      const auto e = eps_.head(n_);
      bool ok = true;
      // grad = outer(u, w) on the lower triangle (+ outer(c, a) + outer(g_x, v) / 2)
      vector_d& u = tmp_;
      vector_d& w = a_;  // a_ holds eps + L'g_x/2 for Langevin; reused below
      bool extra = false;
      if (log_ratio < 0) {
        if (!langevin_) {
          u = gy_;
          w = e;
        } else {  // u_x = L'g_x, u_y = L'g_y from step()
          if (exact_) {  // c = -H(L(a + u_y/2))/2, a = eps + u_x/2
            w_exact_a_ = e + 0.5 * ux_;  // preallocated: no allocation per iteration
            c_ = w_exact_a_ + 0.5 * uy_;
            vector_d& v = tmp_;          // free until u is set below
            times_l(c_, v);
            double lp_h;
            *n_hvp += 1;
            try {
              ensure_ad_tape();
              model_hessian_times_vector(*m_->model, true, true, y_, v, lp_h, hv_);
              ok = hv_.allFinite();
            } catch (...) {
              ok = false;
            }
            if (ok) {
              c_ = -0.5 * hv_;
              times_lt(c_, hv_);  // hv_ <- L'c
              extra = true;
            }
          }
          u = 0.5 * (gy_ - gx_);
          w = e + 0.5 * (ux_ - uy_);
        }
      }
      if (ok) {  // row by row: g, then G and L (ahmc_triangular::rmsprop_row)
        const bool outer = log_ratio < 0;
        for (int i = 0; i < n_; ++i) {
          const int len = i + 1;
          double* l_row = chol_.data() + static_cast<size_t>(i) * n_;
          auto g = row_grad_.head(len);
          const double diag = l_row[i];
          double* g_row = sq_grad_.data() + static_cast<size_t>(i) * n_;
          if (outer && !extra) {  // g = u_i w, + beta / L_ii on the diagonal
            ahmc_triangular::rmsprop_outer_row(len, u[i], w.data(), beta / diag, g.data(),
                                               g_row, l_row, rate);
          } else if (extra) {
            if (outer) g = u[i] * w.head(len).array();
            else g.setZero();
            g += c_[i] * w_exact_a_.head(len).array() + (0.5 * gx_[i]) * hv_.head(len).array();
            g[i] += beta / diag;
            ahmc_triangular::rmsprop_row(len, g.data(), g_row, l_row, rate);
          } else {  // g is 0 left of the diagonal: G shrinks, L stays (the same roundings)
            ahmc_triangular::scale_row(i, g_row, 0.9);
            const double g_ii = beta / diag;
            ahmc_triangular::rmsprop_row(1, &g_ii, g_row + i, l_row + i, rate);
          }
          l_row[i] = std::max(l_row[i], min_ratio * diag);
        }
      }
    }
    beta = std::max(min_beta, beta * (1 + rho * ((accepted ? 1.0 : 0.0) - alpha)));
  }

  // baselines.AdaptiveMetropolis.adapt: params {gamma0, decay, mean_rate, delta, s_d,
  // adapt_scale, target, gamma, t0, kappa}, state {t, lambda, mu, counter, s_bar, x_bar,
  // log lambda}.
  void am_adapt(const vector_d& x_new, double prob) {
    double& t = state_[0];
    if (t == 0) std::copy(x_new.data(), x_new.data() + n_, mean_);
    t += 1;
    const double gamma = params_[0] / (1 + t / params_[1]);
    Eigen::Map<vector_d> mean(mean_, n_);
    tmp_ = x_new - mean;
    mean += params_[2] * tmp_;
    // L' L'^T = LL^T + vv^T with v = sqrt(gamma / (1 - gamma)) d, then L' sqrt(1 - gamma)
    tmp_ *= std::sqrt(gamma / (1 - gamma));
    ahmc_triangular::rank_one_update_col_major(n_, am_l_.data(), tmp_.data());
    am_l_.triangularView<Eigen::Lower>() *= std::sqrt(1 - gamma);
    if (params_[5] != 0) {  // the global scale, dual-averaged
      dual_averaging(state_ + 2, prob, 6);
      state_[1] = std::exp(state_[6]);
    }
  }

  const bs_model* m_;
  int n_, adapt_;
  bool langevin_, exact_, am_, dense_;
  const double* params_;
  double* state_;
  Eigen::Map<lower_matrix> chol_, sq_grad_;
  double* mean_;
  vector_d x_, gx_;
  double lp_;
  bool ux_current_ = false;
  vector_d eps_, y_, gy_, a_, ux_, uy_, tmp_, c_, hv_, w_exact_a_;
  Eigen::ArrayXd row_grad_;
  Eigen::MatrixXd am_l_;  // AM's L while it adapts, column-major (empty otherwise)
};

}  // namespace

extern "C" {

// `n_rows` rows of MH iterations (mh_chain above), each row the state after
// `steps_per_draw` iterations, from the state (x, grad, lp), updated in place; `adapt`
// (mh_chain's codes; 0 after warmup; `am`: AM's proposal) with its `params`, and its `state`, `chol` (the
// lower-triangular L, row-major n x n; null for a scalar sigma = state[5]),
// `sq_grad` (RMSProp's G, gad) and `mean` (AM) updated in place.  Iteration draws, in
// this order and from `seed` (block_rng), the noise (n normals, 2n for AM), then
// u ~ Uniform(0, 1]; it accepts iff log u < log ratio (a non-finite target rejects).
// Per row it writes the state to `draws` and the row's statistics to `stats` (row-major,
// 8 columns: accept_stat and accepted averaged over the row's iterations, n_grad,
// n_density and n_hvp summed, lp, step size, beta).  `noise` (nullable) gets each
// iteration's normals and log u (n_noise + 1 values per iteration), for tests.
int ahmc_mh_block(const bs_model* m, int n_rows, int steps_per_draw, int adapt,
                  int langevin, int exact, int am, uint64_t seed, const double* params,
                  double* state, double* chol, double* sq_grad, double* mean, double* x,
                  double* grad, double* lp, double* draws, double* stats, double* noise) {
  const int n = m->param_unc_num;
  mh_chain chain(m, adapt, langevin != 0, exact != 0, am != 0, chol != nullptr, params, state, chol,
                 sq_grad, mean, x, grad, *lp);
  block_rng rng(seed);
  const int n_noise = chain.noise_dims();
  vector_d& eps = chain.eps();
  for (int r = 0; r < n_rows; ++r) {
    double* row = stats + static_cast<size_t>(r) * 8;
    std::fill(row, row + 8, 0.0);
    for (int k = 0; k < steps_per_draw; ++k) {
      for (int j = 0; j < n_noise; ++j) eps[j] = rng.normal();
      const double log_u = std::log(rng.uniform_positive());
      if (noise) {
        std::copy(eps.data(), eps.data() + n_noise, noise);
        noise[n_noise] = log_u;
        noise += n_noise + 1;
      }
      double prob;
      const bool accepted = chain.step(adapt != 0, log_u, &prob, &row[2], &row[3], &row[4]);
      row[0] += prob / steps_per_draw;
      row[1] += (accepted ? 1.0 : 0.0) / steps_per_draw;
    }
    std::copy(chain.x().data(), chain.x().data() + n, draws + static_cast<size_t>(r) * n);
    row[5] = chain.lp();
    row[6] = chain.step_size();
    row[7] = chain.beta();
  }
  chain.write_state(x, grad, lp);
  return 0;
}

}  // extern "C"

// ---------------------------------------------------------------------------------------
// Second and third derivatives for Riemann-manifold HMC (ahmc_stan/riemann.py).
//
// Third derivatives: a model reached through `stan::model::model_base` has log_prob
// overloads for double and var only, so the fvar<fvar<var>> evaluations of `stan::math::grad_hessian` and
// `stan::math::grad_tr_mat_times_hessian` live in the model's own translation unit
// (csrc/ahmc_third_order.hpp, appended to the stanc output by ahmc_stan.compiler), which
// defines the two weak symbols below.  Methods:
//   method 2, exact third-order autodiff (when the model has it, see
//     ahmc_third_order_available): n(n+1)/2 fvar<fvar<var>> sweeps for the tensor, n for
//     a contraction;
// and, for models whose functions have no fvar<fvar<var>> instances, finite differences
// of autodiff derivatives, with steps h = rel_step * max(1, |x_l|):
//   method 0, central differences of Hessians,  d_l H ~ (H(x + h e_l) - H(x - h e_l)) / 2h:
//     2n Hessians (2n^2 forward-over-reverse sweeps); rel_step ~ eps^(1/3) = 6e-6 gives
//     ~1e-10 relative error when the Hessians are exact (not for models whose Hessians
//     are themselves differences of gradients: use method 1 there);
//   method 1, second differences of gradients,  d_l d_j g ~ [g(x + h_l e_l + h_j e_j)
//     - g(x + h_l e_l - h_j e_j) - g(x - h_l e_l + h_j e_j) + g(x - h_l e_l - h_j e_j)]
//     / (4 h_l h_j) (and the 3-point rule for l = j): 2n^2 + 1 gradients, several times
//     cheaper; rel_step ~ eps^(1/4) = 1.2e-4 gives ~1e-7 relative error.

extern "C" {
int ahmc_model_third_derivatives(const stan::model::model_base* model,
                                 const double* theta_unc, double* third)
    __attribute__((weak));
int ahmc_model_grad_tr_hessian(const stan::model::model_base* model,
                               const double* theta_unc, const double* mat, double* grad_tr)
    __attribute__((weak));
int ahmc_third_order_available();
}

namespace {

// Log density, gradient and Hessian (n x n, symmetric) by model_hessian (autodiff, or
// differences of gradients); throws what the model throws, or std::domain_error when a result is not finite.
double finite_log_density_hessian(const bs_model* m, const vector_d& x, vector_d& grad,
                                  Eigen::MatrixXd& hess) {
  double lp;
  model_hessian(*m->model, true, true, x, lp, grad, hess);
  if (!std::isfinite(lp) || !grad.allFinite() || !hess.allFinite()) {
    throw std::domain_error("log density or its derivatives not finite");
  }
  return lp;
}

// Calls visit(l, S) for l = 0..n-1 with S ~ d/dx_l of the Hessian of log pi (symmetric),
// by central differences of autodiff Hessians (see above).
template <typename Visit>
void hessian_derivative_slices(const bs_model* m, const double* theta_unc,
                               double rel_step, Visit&& visit) {
  const int n = m->param_unc_num;
  const vector_d x = Eigen::Map<const vector_d>(theta_unc, n);
  vector_d g;
  Eigen::MatrixXd h_plus, h_minus, slice;
  for (int l = 0; l < n; ++l) {
    const double h = rel_step * std::max(1.0, std::abs(x(l)));
    vector_d x_plus = x, x_minus = x;
    x_plus(l) += h;
    x_minus(l) -= h;
    const double width = x_plus(l) - x_minus(l);  // the step actually taken
    finite_log_density_hessian(m, x_plus, g, h_plus);
    finite_log_density_hessian(m, x_minus, g, h_minus);
    slice = (h_plus - h_minus) / width;
    slice = 0.5 * (slice + slice.transpose()).eval();
    visit(l, slice);
  }
}

// The gradient of log pi at x; throws when the model throws or it is not finite.
void finite_gradient(const bs_model* m, const vector_d& x, vector_d& grad) {
  grad.resize(x.size());
  const double lp = log_density_gradient(m, true, true, x.data(), grad.data());
  if (!std::isfinite(lp) || !grad.allFinite()) {
    throw std::domain_error("log density or its gradient not finite");
  }
}

// raw[(l * n + j) * n + k] ~ d_l d_j g_k by second differences of autodiff gradients
// (method 1 above); the steps actually taken (x + h - x) divide, so rounding of x + h
// costs nothing.
void gradient_second_differences(const bs_model* m, const double* theta_unc,
                                 double rel_step, std::vector<double>& raw) {
  const int n = m->param_unc_num;
  const vector_d x = Eigen::Map<const vector_d>(theta_unc, n);
  std::vector<double> up(n), down(n);
  for (int l = 0; l < n; ++l) {
    const double h = rel_step * std::max(1.0, std::abs(x(l)));
    up[l] = (x(l) + h) - x(l);
    down[l] = x(l) - (x(l) - h);
  }
  vector_d g0, ga, gb, gc, gd, d(n);
  finite_gradient(m, x, g0);
  auto store = [&](int l, int j) {
    for (int k = 0; k < n; ++k) {
      raw[(static_cast<size_t>(l) * n + j) * n + k] = d(k);
      raw[(static_cast<size_t>(j) * n + l) * n + k] = d(k);
    }
  };
  for (int l = 0; l < n; ++l) {
    vector_d xp = x, xm = x;
    xp(l) += up[l];
    xm(l) -= down[l];
    finite_gradient(m, xp, ga);
    finite_gradient(m, xm, gb);
    // three-point rule with (possibly) unequal steps, exact for quadratics
    d = ((ga - g0) / up[l] - (g0 - gb) / down[l]) / (0.5 * (up[l] + down[l]));
    store(l, l);
    for (int j = l + 1; j < n; ++j) {
      vector_d xpp = xp, xpm = xp, xmp = xm, xmm = xm;
      xpp(j) += up[j];
      xpm(j) -= down[j];
      xmp(j) += up[j];
      xmm(j) -= down[j];
      finite_gradient(m, xpp, ga);
      finite_gradient(m, xpm, gb);
      finite_gradient(m, xmp, gc);
      finite_gradient(m, xmm, gd);
      d = (ga - gb - gc + gd) / ((up[l] + down[l]) * (up[j] + down[j]));
      store(l, j);
    }
  }
}

// The symmetrised third-derivative tensor of ahmc_third_derivatives (below); returns 0,
// 1 when a result is not finite, 2 when method 2 is not available; throws what the model
// throws.
int third_derivative_tensor(const bs_model* m, const double* theta_unc, int method,
                            double rel_step, double* third) {
  const size_t n = m->param_unc_num;
  std::vector<double> raw(n * n * n);
  if (method == 2) {
    if (!ahmc_third_order_available()) return 2;
    if (ahmc_model_third_derivatives(m->model, theta_unc, raw.data())) return 1;
  } else if (method == 0) {
    hessian_derivative_slices(m, theta_unc, rel_step,
                              [&](int l, const Eigen::MatrixXd& s) {
                                for (size_t j = 0; j < n; ++j)
                                  for (size_t k = 0; k < n; ++k)
                                    raw[(l * n + j) * n + k] = s(j, k);
                              });
  } else {
    gradient_second_differences(m, theta_unc, rel_step, raw);
  }
  auto t = [&](size_t a, size_t b, size_t c) { return raw[(a * n + b) * n + c]; };
  for (size_t a = 0; a < n; ++a)
    for (size_t b = 0; b < n; ++b)
      for (size_t c = 0; c < n; ++c)
        third[(a * n + b) * n + c] = (t(a, b, c) + t(a, c, b) + t(b, a, c) + t(b, c, a)
                                      + t(c, a, b) + t(c, b, a)) / 6.0;
  return 0;
}

}  // namespace

extern "C" {

// Log density, gradient and Hessian (row-major n x n; symmetric) of the unconstrained
// log density (Jacobian included, constants dropped), by model_hessian.
// Returns 0, or 1 when the model threw or a result is not finite.
int ahmc_log_density_hessian(const bs_model* m, const double* theta_unc, double* lp,
                             double* grad, double* hessian) {
  try {
    ensure_ad_tape();
    const int n = m->param_unc_num;
    vector_d x = Eigen::Map<const vector_d>(theta_unc, n);
    vector_d g;
    Eigen::MatrixXd h;
    *lp = finite_log_density_hessian(m, x, g, h);
    std::copy(g.data(), g.data() + n, grad);
    Eigen::Map<Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>>(
        hessian, n, n) = 0.5 * (h + h.transpose());
  } catch (...) {
    *lp = -std::numeric_limits<double>::infinity();
    return 1;
  }
  return 0;
}

// 1 if this model library has exact third-order autodiff (method 2), else 0.
int ahmc_third_order_available() {
  return ahmc_model_third_derivatives != nullptr && ahmc_model_grad_tr_hessian != nullptr;
}

// The third-derivative tensor of log pi, third[(l * n + j) * n + k] = d^3 log pi /
// dx_l dx_j dx_k, by `method` 2 (autodiff), 0 (differences of Hessians) or 1 (second
// differences of gradients) with relative step `rel_step` (see above; ignored by method
// 2), symmetrised over the six index permutations.  Returns 0, 1 when the model threw or
// a result is not finite, 2 when method 2 is not available.
int ahmc_third_derivatives(const bs_model* m, const double* theta_unc, int method,
                           double rel_step, double* third) {
  try {
    ensure_ad_tape();
    return third_derivative_tensor(m, theta_unc, method, rel_step, third);
  } catch (...) {
    return 1;
  }
}

// grad_tr[l] = tr(M d/dx_l of the Hessian of log pi) for a dense n x n matrix M given
// row-major: the gradient of x -> tr(M Hess log pi(x)), the contraction behind every
// Riemannian-HMC force, by stan::math::grad_tr_mat_times_hessian (method 2) or central
// differences of autodiff Hessians (method 0, see above).  Returns 0, 1 or 2 (as above).
int ahmc_log_density_tr_hessian_grad(const bs_model* m, const double* theta_unc,
                                     const double* mat, int method, double rel_step,
                                     double* grad_tr) {
  try {
    ensure_ad_tape();
    if (method == 2) {
      if (!ahmc_third_order_available()) return 2;
      return ahmc_model_grad_tr_hessian(m->model, theta_unc, mat, grad_tr) ? 1 : 0;
    }
    const int n = m->param_unc_num;
    Eigen::Map<const Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>>
        mv(mat, n, n);
    // tr(M S) = sum_jk M_kj S_jk = sum_jk M_jk S_jk for symmetric S.
    hessian_derivative_slices(m, theta_unc, rel_step,
                              [&](int l, const Eigen::MatrixXd& s) {
                                grad_tr[l] = mv.cwiseProduct(s).sum();
                              });
  } catch (...) {
    return 1;
  }
  return 0;
}

}  // extern "C"

// ---------------------------------------------------------------------------------------
// Riemann-manifold HMC with Betancourt's SoftAbs metric (2013, arXiv:1212.4693, section 4)
// and the generalised leapfrog (Girolami & Calderhead 2011, eqs. 16-18): the iterations of
// RMHMCKernel (ahmc_stan/riemann.py, whose module docstring derives the force), with the
// same fixed points (Anderson acceleration of depth 2), thresholds, reversibility check,
// rejection rules and counts of Hessians and third-derivative tensors.  The kernel's Python
// implementation is the reference; tests compare the two on fixed starts and momenta.
//
// A point of a trajectory crosses to Python packed in one array (RMHMCState.packed):
// x[n], lp, grad[n], lambda[n] (eigenvalues of -Hess log pi, ascending), Q[n x n]
// (eigenvectors as columns, row-major), f[n] = SoftAbs(lambda), f'[n], J[n x n] (divided
// differences, row-major), the momentum-free force[n] = d/dx [U + log det G / 2] and the
// third-derivative tensor T[n x n x n]: 1 + 6n + 2n^2 + n^3 doubles.
//
// Options, a double array (NativeDensity.rmhmc_options): softness alpha, fixed-point
// tolerance, maximum fixed-point iterations, check reversibility (0/1), reversibility
// tolerance, Hessian method (0: model_hessian, autodiff where the model has it; 1: central
// differences of gradients, H[:, i] = (g(x + h_i e_i) - g(x - h_i e_i)) / (the steps
// taken), h_i = step max(1, |x_i|), symmetrised), its relative step, third-derivative
// method (ahmc_third_derivatives' codes) and step, and the energy error that counts as a
// divergence.

namespace {

using row_matrix = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

struct rmhmc_options {
  explicit rmhmc_options(const double* o)
      : softness(o[0]), tol(o[1]), max_iter(static_cast<int>(o[2])),
        check_reversibility(o[3] != 0), reversibility_tol(o[4]),
        hessian_method(static_cast<int>(o[5])), hessian_step(o[6]),
        third_method(static_cast<int>(o[7])), third_step(o[8]), max_energy_error(o[9]) {}
  double softness, tol;
  int max_iter;
  bool check_reversibility;
  double reversibility_tol;
  int hessian_method;
  double hessian_step;
  int third_method;
  double third_step, max_energy_error;
};

// A position with its SoftAbs geometry (RMHMCState); T and what derives from it (J, the
// momentum-free force) only on points of a trajectory, not on the trial points of the
// implicit position update.
struct softabs_point {
  explicit softabs_point(Eigen::Index n)
      : x(n), grad(n), lam(n), f(n), fp(n), static_force(n), Q(n, n), J(n, n) {}
  static size_t packed_size(size_t n) { return 1 + 6 * n + 2 * n * n + n * n * n; }

  void load(const double* packed) {
    const Eigen::Index n = x.size();
    lp = packed[n];
    x = Eigen::Map<const vector_d>(packed, n);
    packed += n + 1;
    for (vector_d* v : {&grad, &lam}) {
      *v = Eigen::Map<const vector_d>(packed, n);
      packed += n;
    }
    Q = Eigen::Map<const row_matrix>(packed, n, n);
    packed += n * n;
    for (vector_d* v : {&f, &fp}) {
      *v = Eigen::Map<const vector_d>(packed, n);
      packed += n;
    }
    J = Eigen::Map<const row_matrix>(packed, n, n);
    packed += n * n;
    static_force = Eigen::Map<const vector_d>(packed, n);
    T = Eigen::Map<const row_matrix>(packed + n, n, n * n);
  }

  void store(double* packed) const {
    const Eigen::Index n = x.size();
    Eigen::Map<vector_d>(packed, n) = x;
    packed[n] = lp;
    packed += n + 1;
    for (const vector_d* v : {&grad, &lam}) {
      Eigen::Map<vector_d>(packed, n) = *v;
      packed += n;
    }
    Eigen::Map<row_matrix>(packed, n, n) = Q;
    packed += n * n;
    for (const vector_d* v : {&f, &fp}) {
      Eigen::Map<vector_d>(packed, n) = *v;
      packed += n;
    }
    Eigen::Map<row_matrix>(packed, n, n) = J;
    packed += n * n;
    Eigen::Map<vector_d>(packed, n) = static_force;
    Eigen::Map<row_matrix>(packed + n, n, n * n) = T;
  }

  vector_d x, grad, lam, f, fp, static_force;
  Eigen::MatrixXd Q, J;
  row_matrix T;  // T(l, j n + k) = d^3 log pi / dx_l dx_j dx_k
  double lp = 0.0;
};

// f(lambda) = lambda coth(alpha lambda) and f'; with z = alpha lambda the series below
// |z| < 1e-4 and |lambda| above |z| > 20 (riemann.softabs_eigenvalues).
void softabs_eigenvalues(double alpha, const vector_d& lam, vector_d& f, vector_d& fp) {
  for (Eigen::Index i = 0; i < lam.size(); ++i) {
    const double z = alpha * lam(i), az = std::abs(z);
    if (az < 1e-4) {
      f(i) = (1.0 + z * z / 3.0) / alpha;
      fp(i) = 2.0 * z / 3.0 * (1.0 - 2.0 * z * z / 15.0);
    } else if (az <= 20.0) {
      const double coth = 1.0 / std::tanh(z), s = std::sinh(z);
      f(i) = lam(i) * coth;
      fp(i) = coth - z / (s * s);
    } else {
      f(i) = std::abs(lam(i));
      fp(i) = lam(i) > 0 ? 1.0 : -1.0;
    }
  }
}

// The generalised leapfrog on one model (RMHMCKernel.geometry, .leapfrog, .integrate),
// counting the Hessians and tensors it evaluates.
class rmhmc_integrator {
 public:
  rmhmc_integrator(const bs_model* m, const rmhmc_options& o)
      : m_(m), o_(o), n_(m->param_unc_num), hess_(n_, n_), trial_(n_) {}

  int n_hessian = 0, n_third = 0;

  // The geometry at x into pt (x must not alias pt.x); false where the density or a
  // derivative is not finite.  `third` false: a trial point, without T.
  bool geometry(const vector_d& x, softabs_point& pt, bool third) {
    ++n_hessian;
    try {
      pt.x = x;
      if (!hessian(x, pt.lp, pt.grad)) return false;
      eigen_.compute(-hess_);
      if (eigen_.info() != Eigen::Success) return false;
      pt.lam = eigen_.eigenvalues();
      pt.Q = eigen_.eigenvectors();
      softabs_eigenvalues(o_.softness, pt.lam, pt.f, pt.fp);
      if (!third) return true;
      ++n_third;
      pt.T.resize(n_, n_ * n_);
      if (third_derivative_tensor(m_, x.data(), o_.third_method, o_.third_step,
                                  pt.T.data()) != 0) {
        return false;
      }
    } catch (...) {
      return false;
    }
    for (Eigen::Index i = 0; i < n_; ++i) {  // riemann.softabs_divided_differences
      for (Eigen::Index j = 0; j < n_; ++j) {
        const double dl = pt.lam(i) - pt.lam(j);
        const double scale = std::max(std::max(std::abs(pt.lam(i)), std::abs(pt.lam(j))),
                                      1.0 / o_.softness);
        pt.J(i, j) = std::abs(dl) <= 1e-7 * scale ? 0.5 * (pt.fp(i) + pt.fp(j))
                                                   : (pt.f(i) - pt.f(j)) / dl;
      }
    }
    // d/dx [U + log det G / 2] = -grad - tr(W0 d_l Hess log pi), W0 = Q diag(f'/2f) Q'
    work_.noalias() = pt.Q * (0.5 * pt.fp.cwiseQuotient(pt.f)).asDiagonal() * pt.Q.transpose();
    pt.static_force.noalias() = -pt.grad - pt.T * Eigen::Map<const vector_d>(work_.data(),
                                                                            n_ * n_);
    return true;
  }

  // dH/dx at pt for momentum p: the momentum-free force + tr(B d_l Hess log pi) / 2 with
  // B = Q (J o v v') Q', v = diag(1/f) Q'p (RMHMCState.force).
  void force(const softabs_point& pt, const vector_d& p, vector_d& out) {
    v_.noalias() = pt.Q.transpose() * p;
    v_.array() /= pt.f.array();
    mat_ = pt.J.cwiseProduct(v_ * v_.transpose());
    work_.noalias() = pt.Q * mat_ * pt.Q.transpose();
    out = pt.static_force;
    out.noalias() += 0.5 * (pt.T * Eigen::Map<const vector_d>(work_.data(), n_ * n_));
  }

  // G^-1 p.
  void velocity(const softabs_point& pt, const vector_d& p, vector_d& out) {
    v_.noalias() = pt.Q.transpose() * p;
    v_.array() /= pt.f.array();
    out.noalias() = pt.Q * v_;
  }

  // U + log det G / 2 + p'G^-1 p / 2.
  double hamiltonian(const softabs_point& pt, const vector_d& p) {
    v_.noalias() = pt.Q.transpose() * p;
    const double kinetic = 0.5 * (v_.array().square() / pt.f.array()).sum();
    return -pt.lp + 0.5 * pt.f.array().log().sum() + kinetic;
  }

  // One generalised leapfrog step from (from, p) to `to`, p updated; 0 ok, 1 a fixed
  // point did not converge, 2 not finite (p unchanged on failure).
  int leapfrog(const softabs_point& from, vector_d& p, double eps, softabs_point& to) {
    const double half = 0.5 * eps;
    int status = fixed_point(  // the implicit momentum half step
        [&](const vector_d& q, vector_d& out) {
          force(from, q, force_);
          out = p - half * force_;
          return true;
        },
        p, p_half_);
    if (status) return status;
    velocity(from, p_half_, v0_);
    start_ = from.x + eps * v0_;
    status = fixed_point(  // the implicit position step, from the iterate of x' = x
        [&](const vector_d& y, vector_d& out) {
          if (!geometry(y, trial_, false)) return false;
          velocity(trial_, p_half_, v1_);
          out = from.x + half * (v0_ + v1_);
          return true;
        },
        start_, x_new_);
    if (status) return status;
    if (!geometry(x_new_, to, true)) return 2;
    force(to, p_half_, force_);
    p = p_half_ - half * force_;
    return 0;
  }

  // n_steps steps from (start, p) through the buffers a and b, stopping at the first
  // failure; returns its status, sets `taken` and, on success, `end`.
  int integrate(const softabs_point& start, vector_d& p, double eps, int n_steps,
                softabs_point& a, softabs_point& b, const softabs_point*& end, int& taken) {
    const softabs_point* from = &start;
    for (int step = 0; step < n_steps; ++step) {
      softabs_point& to = step % 2 == 0 ? a : b;
      const int status = leapfrog(*from, p, eps, to);
      if (status) {
        taken = step + 1;
        return status;
      }
      from = &to;
    }
    taken = n_steps;
    end = from;
    return 0;
  }

  // max |a - b| <= tol max(1, max |b|).
  static bool close(const vector_d& a, const vector_d& b, double tol) {
    return (a - b).cwiseAbs().maxCoeff() <= tol * std::max(1.0, b.cwiseAbs().maxCoeff());
  }

 private:
  bool hessian(const vector_d& x, double& lp, vector_d& grad) {
    if (o_.hessian_method != 1) {
      lp = finite_log_density_hessian(m_, x, grad, hess_);
      hess_ = (0.5 * (hess_ + hess_.transpose())).eval();
      return true;
    }
    if (ahmc_log_density_gradient(m_, true, true, x.data(), &lp, grad.data())) return false;
    y_ = x;
    above_.resize(n_);
    below_.resize(n_);
    double lp_at;
    for (Eigen::Index i = 0; i < n_; ++i) {
      const double h = o_.hessian_step * std::max(1.0, std::abs(x(i)));
      y_(i) = x(i) + h;
      const double up = y_(i) - x(i);  // the steps actually taken
      if (ahmc_log_density_gradient(m_, true, true, y_.data(), &lp_at, above_.data()))
        return false;
      y_(i) = x(i) - h;
      const double down = x(i) - y_(i);
      if (ahmc_log_density_gradient(m_, true, true, y_.data(), &lp_at, below_.data()))
        return false;
      y_(i) = x(i);
      hess_.col(i) = (above_ - below_) / (up + down);
    }
    hess_ = (0.5 * (hess_ + hess_.transpose())).eval();
    return hess_.allFinite();
  }

  // Solves y = g(y) from `start` by fixed-point iteration with Anderson acceleration of
  // depth 2 (Walker & Ni 2011; RMHMCKernel._fixed_point): converged when
  // max |g(y) - y| <= tol max(1, max |g(y)|), then out = g(y) and 0; 1 after max_iter
  // iterations, 2 where g fails or is not finite.  The least squares of the acceleration
  // by SVD with numpy's lstsq cutoff (minimum norm).
  template <typename G>
  int fixed_point(G&& g, const vector_d& start, vector_d& out) {
    y_fp_ = start;
    int count = 0;
    for (int it = 0; it < o_.max_iter; ++it) {
      if (!g(y_fp_, gy_) || !gy_.allFinite()) return 2;
      if (close(gy_, y_fp_, o_.tol)) {
        out = gy_;
        return 0;
      }
      if (count == 3) {
        std::swap(gs_[0], gs_[1]);
        std::swap(gs_[1], gs_[2]);
        std::swap(fs_[0], fs_[1]);
        std::swap(fs_[1], fs_[2]);
        count = 2;
      }
      gs_[count] = gy_;
      fs_[count] = gy_ - y_fp_;
      ++count;
      if (count > 1) {
        d_f_.resize(n_, count - 1);
        d_g_.resize(n_, count - 1);
        for (int c = 0; c + 1 < count; ++c) {
          d_f_.col(c) = fs_[c + 1] - fs_[c];
          d_g_.col(c) = gs_[c + 1] - gs_[c];
        }
        svd_.compute(d_f_, Eigen::ComputeThinU | Eigen::ComputeThinV);
        svd_.setThreshold(std::numeric_limits<double>::epsilon()
                          * std::max<Eigen::Index>(n_, count - 1));
        gamma_ = svd_.solve(fs_[count - 1]);
        y_fp_ = gy_ - d_g_ * gamma_;
      } else {
        y_fp_ = gy_;
      }
    }
    return 1;
  }

  const bs_model* m_;
  rmhmc_options o_;
  Eigen::Index n_;
  Eigen::MatrixXd hess_, mat_, d_f_, d_g_;
  row_matrix work_;
  Eigen::SelfAdjointEigenSolver<Eigen::MatrixXd> eigen_;
  Eigen::JacobiSVD<Eigen::MatrixXd> svd_;
  softabs_point trial_;
  vector_d y_, above_, below_, v_, force_, p_half_, v0_, v1_, start_, x_new_, y_fp_, gy_,
      gamma_, gs_[3], fs_[3];
};

// Columns of ahmc_rmhmc_block's statistics (RMHMCKernel.NATIVE_STATS).
constexpr int kRmhmcStats = 10;

// One chain's RMHMC transitions (RMHMCKernel.transition) from a packed point: the current
// point, two buffers for the forward trajectory and two for the reversibility check's;
// the point kept on acceptance changes place, nothing is copied.  The five tensors take
// 5 n^3 doubles (320 MB at n = 200, the largest SoftAbs default; the check's two
// buffers are filled on its first use).
class rmhmc_chain {
 public:
  rmhmc_chain(const bs_model* m, const rmhmc_options& o, const double* packed)
      : o_(o), integrator_(m, o), p_(m->param_unc_num), back_p_(m->param_unc_num) {
    for (int i = 0; i < 5; ++i) points_.emplace_back(m->param_unc_num);
    points_[0].load(packed);
  }
  rmhmc_integrator& integrator() { return integrator_; }
  const softabs_point& current() const { return points_[cur_]; }

  // p ~ N(0, G(x)) = Q diag(sqrt f) z.
  void momentum(const vector_d& z, vector_d& p) const {
    const softabs_point& s = current();
    p.noalias() = s.Q * s.f.cwiseSqrt().cwiseProduct(z);
  }

  // The iteration from momentum p0 with n_steps steps, accepting iff log u < -dH and
  // (with the check) the trajectory from (x', -p') returns to (x, p0); its statistics
  // into stats[kRmhmcStats].
  void transition(const vector_d& p0, int n_steps, double log_u, double eps,
                  double* stats) {
    const int hessians = integrator_.n_hessian, thirds = integrator_.n_third;
    const softabs_point& state = points_[cur_];
    int others[4], k = 0;
    for (int i = 0; i < 5; ++i)
      if (i != cur_) others[k++] = i;
    const double h0 = integrator_.hamiltonian(state, p0);
    p_ = p0;
    const softabs_point* end = nullptr;
    int taken = 0;
    int status = integrator_.integrate(state, p_, eps, n_steps, points_[others[0]],
                                       points_[others[1]], end, taken);
    const double inf = std::numeric_limits<double>::infinity();
    const double delta = status == 0 ? integrator_.hamiltonian(*end, p_) - h0 : inf;
    bool accepted = log_u < -delta;
    if (accepted && o_.check_reversibility) {
      back_p_ = -p_;
      const softabs_point* back = nullptr;
      int taken_back = 0;
      const int status_back = integrator_.integrate(*end, back_p_, eps, n_steps,
                                                    points_[others[2]], points_[others[3]],
                                                    back, taken_back);
      taken += taken_back;
      if (!(status_back == 0
            && rmhmc_integrator::close(back->x, state.x, o_.reversibility_tol)
            && rmhmc_integrator::close(-back_p_, p0, o_.reversibility_tol))) {
        accepted = false;
        status = 1;
      }
    }
    const bool failed = status == 1;
    const bool finite = std::isfinite(delta);
    stats[0] = !failed && finite ? std::min(1.0, std::exp(-delta)) : 0.0;
    stats[1] = accepted;
    stats[2] = status == 2 || (finite && delta > o_.max_energy_error);
    stats[3] = n_steps;
    stats[4] = accepted ? h0 + delta : h0;
    if (accepted) cur_ = static_cast<int>(end - points_.data());
    stats[5] = points_[cur_].lp;
    stats[6] = integrator_.n_hessian - hessians;
    stats[7] = integrator_.n_third - thirds;
    stats[8] = failed;
    stats[9] = taken;
  }

 private:
  rmhmc_options o_;
  rmhmc_integrator integrator_;
  std::vector<softabs_point> points_;
  int cur_ = 0;
  vector_d p_, back_p_;
};

}  // namespace

extern "C" {

// The SoftAbs geometry at `x` (RMHMCKernel.init) into `point` (packed, see above), with
// the `options` above; counts[0..1] = the Hessians and tensors evaluated.  Returns 0, or
// 1 where the density or a derivative is not finite.
int ahmc_rmhmc_geometry(const bs_model* m, const double* options, const double* x,
                        double* point, int* counts) {
  ensure_ad_tape();
  const rmhmc_options o(options);
  rmhmc_integrator integrator(m, o);
  softabs_point pt(m->param_unc_num);
  const bool ok = integrator.geometry(Eigen::Map<const vector_d>(x, m->param_unc_num), pt,
                                      true);
  counts[0] = integrator.n_hessian;
  counts[1] = integrator.n_third;
  if (!ok) return 1;
  pt.store(point);
  return 0;
}

// `n_steps` generalised leapfrog steps of size `eps` from the packed `point` and the
// momentum `p` (RMHMCKernel.integrate), stopping at the first failure: `p` updated, the
// final point packed into `point_out` on success; counts[0..2] = Hessians, tensors, steps
// taken.  Returns 0 ok, 1 a fixed point did not converge, 2 not finite.
int ahmc_rmhmc_integrate(const bs_model* m, const double* options, double eps,
                         int n_steps, const double* point, double* p, double* point_out,
                         int* counts) {
  ensure_ad_tape();
  const Eigen::Index n = m->param_unc_num;
  const rmhmc_options o(options);
  rmhmc_integrator integrator(m, o);
  softabs_point start(n), a(n), b(n);
  start.load(point);
  vector_d momentum = Eigen::Map<const vector_d>(p, n);
  const softabs_point* end = nullptr;
  int taken = 0;
  const int status = integrator.integrate(start, momentum, eps, n_steps, a, b, end, taken);
  counts[0] = integrator.n_hessian;
  counts[1] = integrator.n_third;
  counts[2] = taken;
  Eigen::Map<vector_d>(p, n) = momentum;
  if (status == 0) end->store(point_out);
  return status;
}

// `n_iter` RMHMC iterations (RMHMCKernel.run) at step size `eps` from the packed `point`,
// updated in place.  Iteration i draws, in this order and from `seed` (block_rng), z (n
// normals) for the momentum p = Q diag(sqrt f) z ~ N(0, G(x)), L_r ~ Uniform{1..max_steps}
// (max_steps without `jitter`) and u ~ Uniform(0, 1], then makes the transition with
// log u.  Per iteration it writes the point kept to `draws` (row i) and kRmhmcStats
// statistics to `stats` (row-major: accept_stat, accepted, divergent, L_r, energy, lp,
// Hessians, tensors, fixed-point failure, leapfrog steps); `noise` (nullable) gets p, L_r
// and log u (n + 2 values), for tests.  Returns 0, or 1 on an exception (out of memory).
int ahmc_rmhmc_block(const bs_model* m, const double* options, int n_iter, double eps,
                     int max_steps, int jitter, uint64_t seed, double* point, double* draws,
                     double* stats, double* noise) try {
  ensure_ad_tape();
  const int n = m->param_unc_num;
  const rmhmc_options o(options);
  rmhmc_chain chain(m, o, point);
  block_rng rng(seed);
  vector_d z(n), p(n);
  for (int i = 0; i < n_iter; ++i) {
    for (int j = 0; j < n; ++j) z(j) = rng.normal();
    chain.momentum(z, p);
    const int n_steps = jitter ? rng.uniform_int(1, max_steps) : max_steps;
    const double log_u = std::log(rng.uniform_positive());
    if (noise) {
      double* row = noise + static_cast<size_t>(i) * (n + 2);
      std::copy(p.data(), p.data() + n, row);
      row[n] = n_steps;
      row[n + 1] = log_u;
    }
    chain.transition(p, n_steps, log_u, eps, stats + static_cast<size_t>(i) * kRmhmcStats);
    const vector_d& x = chain.current().x;
    std::copy(x.data(), x.data() + n, draws + static_cast<size_t>(i) * n);
  }
  chain.current().store(point);
  return 0;
} catch (...) {
  return 1;
}

}  // extern "C"
