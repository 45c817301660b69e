// Third-order autodiff of the log density, for Riemann-manifold HMC (ahmc_stan/riemann.py).
//
// ahmc_stan.compiler appends `#include "ahmc_third_order.hpp"` to the stanc output of every
// model, so this code sees the model's concrete class `stan_model`: `model_base` (all that
// the C layer in ahmc_bridge.cpp can reach) has log_prob overloads for double, var and
// fvar<var> only, while third derivatives need fvar<fvar<var>>.  If a model's functions
// have no fvar<fvar<var>> instances the compiler builds the model without this file, and
// the C layer falls back to finite differences of autodiff Hessians (ahmc_bridge.cpp
// declares these symbols weak).
//
// Both functions work on the unconstrained log density with the Jacobian, constants
// dropped (as ahmc_log_density_hessian), return 0 on success and 1 if the model threw or
// a result is not finite; the caller has made sure the thread has an autodiff tape.

namespace ahmc_third_order {

struct unconstrained_log_density {
  const stan_model& model;

  template <typename T>
  T operator()(const Eigen::Matrix<T, Eigen::Dynamic, 1>& x) const {
    // log_prob takes a non-const reference but does not modify it
    return model.template log_prob<true, true, T>(
        const_cast<Eigen::Matrix<T, Eigen::Dynamic, 1>&>(x), nullptr);
  }
};

inline const stan_model& concrete(const stan::model::model_base* base) {
  return dynamic_cast<const stan_model&>(*base);
}

}  // namespace ahmc_third_order

extern "C" {

// third[(l * n + j) * n + k] = d^3 log pi / dx_l dx_j dx_k by stan::math::grad_hessian
// (fvar<fvar<var>>: n(n+1)/2 evaluations with a reverse sweep each).
int ahmc_model_third_derivatives(const stan::model::model_base* base,
                                 const double* theta_unc, double* third) {
  try {
    const auto& model = ahmc_third_order::concrete(base);
    const Eigen::Index n = model.num_params_r();
    const Eigen::VectorXd x = Eigen::Map<const Eigen::VectorXd>(theta_unc, n);
    double lp;
    Eigen::MatrixXd hess;
    std::vector<Eigen::MatrixXd> grad_hess;
    stan::math::grad_hessian(ahmc_third_order::unconstrained_log_density{model}, x, lp,
                             hess, grad_hess);
    // grad_hess[j](k, l) = d_l of H(j, k)
    for (Eigen::Index l = 0; l < n; ++l)
      for (Eigen::Index j = 0; j < n; ++j)
        for (Eigen::Index k = 0; k < n; ++k) {
          const double t = grad_hess[j](k, l);
          if (!std::isfinite(t)) return 1;
          third[(l * n + j) * n + k] = t;
        }
  } catch (...) {
    return 1;
  }
  return 0;
}

// grad_tr[l] = tr(M d_l Hess log pi(x)) for M given row-major, by
// stan::math::grad_tr_mat_times_hessian (n fvar<fvar<var>> evaluations, one reverse sweep).
int ahmc_model_grad_tr_hessian(const stan::model::model_base* base,
                               const double* theta_unc, const double* mat,
                               double* grad_tr) {
  try {
    const auto& model = ahmc_third_order::concrete(base);
    const Eigen::Index n = model.num_params_r();
    const Eigen::VectorXd x = Eigen::Map<const Eigen::VectorXd>(theta_unc, n);
    const Eigen::MatrixXd m = Eigen::Map<const Eigen::Matrix<
        double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>>(mat, n, n);
    Eigen::VectorXd g;
    stan::math::grad_tr_mat_times_hessian(ahmc_third_order::unconstrained_log_density{model},
                                          x, m, g);
    if (!g.allFinite()) return 1;
    std::copy(g.data(), g.data() + n, grad_tr);
  } catch (...) {
    return 1;
  }
  return 0;
}

}  // extern "C"
