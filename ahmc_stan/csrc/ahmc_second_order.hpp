// Second-order autodiff of the log density (forward-over-reverse, fvar<var>): the Hessian
// and Hessian-vector products behind bs_log_density_hessian,
// bs_log_density_hessian_vector_product and Riemann-manifold HMC.
//
// ahmc_stan.compiler appends `#include "ahmc_second_order.hpp"` to the stanc output of
// every model, so this code sees the model's concrete class `stan_model` and the C layer
// (ahmc_bridge.cpp, which declares these functions weak) needs no fvar<var> overloads of
// `model_base`.  Stan's ODE solvers, algebraic solvers and 1-D integrators have no
// forward-mode instances: a model that calls them is built without this file, and the C
// layer computes Hessians by central differences of autodiff gradients, as BridgeStan does
// by default (the build log says so and why).
//
// Both functions work on the unconstrained log density, throw what the model throws, and
// need an autodiff tape on the calling thread (the caller makes sure of that).

namespace ahmc_second_order {

template <bool Propto, bool Jacobian>
struct log_density {
  const stan_model& model;
  std::ostream* msgs;

  template <typename T>
  T operator()(const Eigen::Matrix<T, Eigen::Dynamic, 1>& x) const {
    // log_prob takes a non-const reference but does not modify it
    return model.template log_prob<Propto, Jacobian, T>(
        const_cast<Eigen::Matrix<T, Eigen::Dynamic, 1>&>(x), msgs);
  }
};

// Calls f(functor) with the functor for the run-time (propto, jacobian) flags.
template <typename F>
void with_log_density(const stan::model::model_base* base, bool propto, bool jacobian,
                      std::ostream* msgs, F&& f) {
  const auto& model = dynamic_cast<const stan_model&>(*base);
  if (propto) {
    if (jacobian) f(log_density<true, true>{model, msgs});
    else f(log_density<true, false>{model, msgs});
  } else {
    if (jacobian) f(log_density<false, true>{model, msgs});
    else f(log_density<false, false>{model, msgs});
  }
}

}  // namespace ahmc_second_order

namespace ahmc_native {

void model_hessian(const stan::model::model_base* base, bool propto, bool jacobian,
                   const Eigen::VectorXd& x, double& lp, Eigen::VectorXd& grad,
                   Eigen::MatrixXd& hess, std::ostream* msgs) {
  ahmc_second_order::with_log_density(base, propto, jacobian, msgs, [&](const auto& f) {
    stan::math::hessian(f, x, lp, grad, hess);
  });
}

void model_hessian_times_vector(const stan::model::model_base* base, bool propto,
                                bool jacobian, const Eigen::VectorXd& x,
                                const Eigen::VectorXd& v, double& lp, Eigen::VectorXd& hv,
                                std::ostream* msgs) {
  ahmc_second_order::with_log_density(base, propto, jacobian, msgs, [&](const auto& f) {
    stan::math::hessian_times_vector(f, x, v, lp, hv);
  });
}

}  // namespace ahmc_native
