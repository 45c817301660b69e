// The Bayesian-optimisation tuner of AHMC (Wang, Mohamed & de Freitas, ICML 2013,
// section 3 and Algorithm 2) in C++, so that a chain's blocks and the tuner's moves run
// in one call (ahmc_tuned_hmc_block in ahmc_bridge.cpp).  It depends on Eigen only and
// knows nothing of samplers: it is told the reward of a block run at gamma and a uniform,
// and decides the next gamma.
//
// ahmc_stan/tuning/bayesopt.py (BayesOptTuner) and ahmc_stan/tuning/gp.py
// (GaussianProcess) are the reference for every operation here, with the same
// conventions: the GP works on the unit cube with SE-ARD length scales kappa per
// dimension, unit signal variance and noise variance sigma^2 / n_j at an input observed
// n_j times (repeats merged exactly); the acquisition u = s mu + p sqrt(beta_{i+1}) sigma
// is maximised over a fixed candidate grid (ties to the first point); s = alpha / r_max
// after each new positive maximum; p_i = max(i - k + 1, 1)^-1/2 (or exp(-lambda (i - 1)));
// beta_t = 2 log(t^{d/2+2} pi^2 / (3 delta)).  The posterior on the grid is carried from
// one move to the next (A^-1 = (K + diag(noise))^-1, W = k(grid, X) A^-1 and q = rowsum(W
// .* k(grid, X)), updated by the block-inverse formula for a new input and by
// Sherman-Morrison when an input's noise shrinks), recomputed from a Cholesky
// factorisation every `refresh_every` updates.

#ifndef AHMC_TUNER_HPP
#define AHMC_TUNER_HPP

#include <Eigen/Dense>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <vector>

namespace ahmc_tuner {

using vec = Eigen::VectorXd;
using mat = Eigen::MatrixXd;
using row_mat = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

// The tuner's constants; `config` as ahmc_bo_new takes it (ahmc_stan/tuning/native_tuner.py).
struct settings {
  double kappa, noise_var, signal_var, alpha, delta, k, lam;
  int schedule;  // 0: p_i = max(i - k + 1, 1)^-1/2 (AHMC); 1: exp(-lam (i - 1)) (thesis)
  int refresh_every;
  explicit settings(const double* c)
      : kappa(c[0]), noise_var(c[1]), signal_var(c[2]), alpha(c[3]), delta(c[4]), k(c[5]),
        lam(c[6]), schedule(static_cast<int>(c[7])), refresh_every(static_cast<int>(c[8])) {}
};

// Zero-mean GP regression with a fixed SE-ARD kernel on the unit cube, its posterior kept
// on a fixed candidate grid (see the file comment; gp.py's GaussianProcess).
class grid_gp {
 public:
  grid_gp(int ndim, const settings& s, const row_mat& grid)
      : d_(ndim), length_(s.kappa), noise_var_(s.noise_var), signal_(s.signal_var),
        refresh_every_(s.refresh_every), grid_(grid), Kc_(grid.rows(), 0),
        W_(grid.rows(), 0) {}

  int n_unique() const { return static_cast<int>(x_.size()); }

  // Adds y observed at the unit-cube point x (repeats of an input merged).
  void add(const vec& x, double y) {
    for (int j = 0; j < n_unique(); ++j) {
      if (x_[j] == x) {
        sum_[j] += y;
        count_[j] += 1;
        return;
      }
    }
    x_.push_back(x);
    sum_.push_back(y);
    count_.push_back(1);
  }

  double kernel(const double* a, const double* b) const {
    double sq = 0;
    for (int j = 0; j < d_; ++j) {
      const double diff = (a[j] - b[j]) / length_;
      sq += diff * diff;
    }
    return signal_ * std::exp(-0.5 * sq);
  }

  // Posterior mean and variance of f on the grid.
  void predict_grid(vec& mean, vec& var) {
    const int u = n_unique();
    const Eigen::Index n = grid_.rows();
    mean.setZero(n);
    var.setConstant(n, signal_);
    if (u == 0) return;
    update_cross_kernel();
    if (!carried_ || updates_ >= refresh_every_) {
      carry_from_scratch();
    } else {
      carry_forward();
    }
    vec means(u);
    for (int j = 0; j < u; ++j) means[j] = sum_[j] / count_[j];
    mean.noalias() = W_.leftCols(u) * means;
    var = (signal_ - q_.array()).max(0.0).matrix();
  }

 private:
  mat kernel_matrix() const {
    const int u = n_unique();
    mat K(u, u);
    for (int a = 0; a < u; ++a)
      for (int b = 0; b <= a; ++b) K(a, b) = K(b, a) = kernel(x_[a].data(), x_[b].data());
    return K;
  }

  // The Cholesky factorisation of A, exact first, then with jitter growing 10x (as
  // gp.py's _factorise).
  Eigen::LLT<mat> factorised(const mat& A) const {
    Eigen::LLT<mat> llt(A);
    double jitter = 1e-10 * signal_;
    for (int attempt = 0; attempt < 8 && llt.info() != Eigen::Success; ++attempt) {
      llt.compute(A + jitter * mat::Identity(A.rows(), A.cols()));
      jitter *= 10;
    }
    return llt;
  }

  // Columns of k(grid, X) for inputs added since the last prediction.
  void update_cross_kernel() {
    const int u = n_unique();
    const Eigen::Index n = grid_.rows();
    if (Kc_.cols() < u) {
      mat grown(n, std::max(2 * u, 16));
      grown.leftCols(kc_cols_) = Kc_.leftCols(kc_cols_);
      Kc_.swap(grown);
    }
    for (int j = kc_cols_; j < u; ++j)
      for (Eigen::Index i = 0; i < n; ++i) Kc_(i, j) = kernel(grid_.row(i).data(), x_[j].data());
    kc_cols_ = u;
  }

  // Room in W_ for u columns, keeping its first `have`.
  void reserve_w(int u, int have) {
    if (W_.cols() < u) {
      mat grown(grid_.rows(), std::max(2 * u, 16));
      grown.leftCols(have) = W_.leftCols(have);
      W_.swap(grown);
    }
  }

  void carry_from_scratch() {
    const int u = n_unique();
    mat A = kernel_matrix();
    noise_.resize(u);
    for (int j = 0; j < u; ++j) {
      noise_[j] = noise_var_ / count_[j];
      A(j, j) += noise_[j];
    }
    Eigen::LLT<mat> llt = factorised(A);
    const mat L_inv = llt.matrixL().solve(mat::Identity(u, u));
    Ainv_.noalias() = L_inv.transpose() * L_inv;
    reserve_w(u, 0);
    W_.leftCols(u).noalias() = Kc_.leftCols(u) * Ainv_;
    q_ = W_.leftCols(u).cwiseProduct(Kc_.leftCols(u)).rowwise().sum();
    updates_ = 0;
    carried_ = true;
  }

  void carry_forward() {
    const int u = n_unique();
    const int n_old = static_cast<int>(noise_.size());
    vec a_j, w_j;
    for (int j = 0; j < n_old; ++j) {  // more observations at an input: Sherman-Morrison
      const double noise = noise_var_ / count_[j];
      const double delta = noise - noise_[j];
      if (delta == 0.0) continue;
      a_j = Ainv_.col(j);
      w_j = W_.col(j);
      const double f = -delta / (1.0 + delta * a_j[j]);
      Ainv_.noalias() += f * a_j * a_j.transpose();
      W_.leftCols(n_old).noalias() += f * w_j * a_j.transpose();
      q_ += f * w_j.cwiseAbs2();
      noise_[j] = noise;
      ++updates_;
    }
    for (int j = n_old; j < u; ++j) {  // a new distinct input: the block inverse
      reserve_w(j + 1, j);
      vec k(j);
      for (int a = 0; a < j; ++a) k[a] = kernel(x_[a].data(), x_[j].data());
      const double noise = noise_var_ / count_[j];
      const vec b = Ainv_ * k;
      const double schur = signal_ + noise - k.dot(b);
      vec t = W_.leftCols(j) * k - Kc_.col(j);
      mat grown(j + 1, j + 1);
      grown.topLeftCorner(j, j) = Ainv_ + b * b.transpose() / schur;
      grown.col(j).head(j) = -b / schur;
      grown.row(j).head(j) = -b.transpose() / schur;
      grown(j, j) = 1.0 / schur;
      Ainv_.swap(grown);
      W_.leftCols(j).noalias() += (1.0 / schur) * t * b.transpose();
      W_.col(j) = -t / schur;
      q_ += t.cwiseAbs2() / schur;
      noise_.conservativeResize(j + 1);
      noise_[j] = noise;
      ++updates_;
    }
  }

  int d_;
  double length_, noise_var_, signal_;
  int refresh_every_;
  row_mat grid_;
  std::vector<vec> x_;
  std::vector<double> sum_;
  std::vector<int> count_;
  mat Kc_;  // k(grid, X), columns in use: kc_cols_
  int kc_cols_ = 0;
  bool carried_ = false;
  mat Ainv_, W_;  // W_: columns in use = noise_.size()
  vec q_, noise_;
  int updates_ = 0;
};

// What one update did: a row of the history (ahmc_stan/tuning/bayesopt.py, TunerRecord).
// Layout: i, gamma[d], reward, p, moved, s, beta, next gamma[d], u.
inline int history_columns(int ndim) { return 7 + 2 * ndim; }

// Algorithm 2's tuner over a box of `ndim` dimensions (box units: low + unit * width,
// integer dimensions rounded half to even).
class bo_tuner {
 public:
  bo_tuner(int ndim, const double* low, const double* width, const int* integer, int n_grid,
           const double* grid_unit, const double* grid_box, const double* config,
           const double* initial)
      : d_(ndim), s_cfg_(config), low_(low, low + ndim), width_(width, width + ndim),
        integer_(integer, integer + ndim),
        grid_box_(Eigen::Map<const row_mat>(grid_box, n_grid, ndim)),
        gp_(ndim, s_cfg_, Eigen::Map<const row_mat>(grid_unit, n_grid, ndim)),
        current_(ndim) {
    snap(initial, current_.data());
  }

  int ndim() const { return d_; }
  int i() const { return i_; }
  double s() const { return s_; }
  double r_max() const { return r_max_; }
  bool frozen() const { return frozen_; }
  void set_frozen(bool frozen) { frozen_ = frozen; }
  const vec& current() const { return current_; }
  const std::vector<double>& history() const { return history_; }
  int n_unique() const { return gp_.n_unique(); }
  grid_gp& gp() { return gp_; }

  double p(int i) const {
    if (s_cfg_.schedule == 1) return std::exp(-s_cfg_.lam * (i - 1));
    return std::pow(std::max(i - s_cfg_.k + 1, 1.0), -0.5);
  }
  double beta(double t) const {
    const double pi = 3.141592653589793;
    return 2.0 * ((d_ / 2.0 + 2.0) * std::log(t) + std::log(pi * pi / (3.0 * s_cfg_.delta)));
  }

  // The reward of a block run at `gamma` (box units); `u` ~ U[0, 1) decides whether to
  // move (unused when frozen).  Appends a history row.  Returns false (and changes
  // nothing) when the reward is not finite.
  bool update(const double* gamma, double reward, double u) {
    if (!std::isfinite(reward)) return false;
    const auto start = std::chrono::steady_clock::now();
    vec x(d_), unit(d_);
    snap(gamma, x.data());
    for (int j = 0; j < d_; ++j) unit[j] = width_[j] > 0 ? (x[j] - low_[j]) / width_[j] : 0.0;
    ++i_;
    gp_.add(unit, reward);  // the GP's data change only here; predictions are lazy
    if (reward > r_max_) {
      if (reward > 0 && std::isfinite(s_cfg_.alpha)) s_ = s_cfg_.alpha / reward;
      r_max_ = reward;
    }
    const double b = beta(i_ + 1.0);
    double p_i = 0.0;
    bool moved = false;
    if (!frozen_) {
      p_i = p(i_);
      moved = u < p_i;
      if (moved) {
        maximise(p_i, b);
      } else {
        current_ = x;
      }
    }
    history_.push_back(i_);
    history_.insert(history_.end(), x.data(), x.data() + d_);
    history_.push_back(reward);
    history_.push_back(p_i);
    history_.push_back(moved);
    history_.push_back(s_);
    history_.push_back(b);
    history_.insert(history_.end(), current_.data(), current_.data() + d_);
    history_.push_back(frozen_ ? std::numeric_limits<double>::quiet_NaN() : u);
    seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return true;
  }

  // Seconds spent in update (the GP and the moves).
  double seconds() const { return seconds_; }

  // Sets the current gamma (box units, snapped into the box).
  void set_current(const double* gamma) { snap(gamma, current_.data()); }

 private:
  void snap(const double* in, double* out) const {
    for (int j = 0; j < d_; ++j) {
      const double v = std::min(std::max(in[j], low_[j]), low_[j] + width_[j]);
      out[j] = integer_[j] ? std::nearbyint(v) : v;
    }
  }

  // gamma_{i+1} = argmax over the grid of s mu + p sqrt(beta) sigma (first maximum).
  void maximise(double p_i, double b) {
    gp_.predict_grid(mean_, var_);
    const double weight = p_i * std::sqrt(b);
    Eigen::Index best = 0;
    double best_val = -std::numeric_limits<double>::infinity();
    for (Eigen::Index g = 0; g < mean_.size(); ++g) {
      const double val = s_ * mean_[g] + weight * std::sqrt(var_[g]);
      if (val > best_val) {
        best_val = val;
        best = g;
      }
    }
    snap(grid_box_.row(best).data(), current_.data());
  }

  int d_;
  settings s_cfg_;
  std::vector<double> low_, width_;
  std::vector<int> integer_;
  row_mat grid_box_;
  grid_gp gp_;
  vec current_, mean_, var_;
  int i_ = 0;
  double s_ = 1.0, r_max_ = -std::numeric_limits<double>::infinity(), seconds_ = 0.0;
  bool frozen_ = false;
  std::vector<double> history_;
};

}  // namespace ahmc_tuner

#endif  // AHMC_TUNER_HPP
