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
// is maximised over a fixed candidate grid (ties to the first point) or by DIRECT
// (direct_minimise below, on -u); s = alpha / r_max
// after each new positive maximum; p_i = max(i - k + 1, 1)^-1/2 (or exp(-lambda (i - 1)));
// beta_t = 2 log(t^{d/2+2} pi^2 / (3 delta)).  The posterior on the grid is carried from
// one move to the next (A^-1 = (K + diag(noise))^-1, W = k(grid, X) A^-1 and q = rowsum(W
// .* k(grid, X)), updated by the block-inverse formula for a new input and by
// Sherman-Morrison when an input's noise shrinks), recomputed from a Cholesky
// factorisation every `refresh_every` updates.  With DIRECT the grid is empty and the
// same carried A^-1 gives the posterior at single points (grid_gp::predict_point).

#ifndef AHMC_TUNER_HPP
#define AHMC_TUNER_HPP

#include <Eigen/Dense>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <numeric>
#include <utility>
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
  int maximizer;  // 0: the candidate grid; 1: DIRECT
  int direct_maxfun;
  explicit settings(const double* c)
      : kappa(c[0]), noise_var(c[1]), signal_var(c[2]), alpha(c[3]), delta(c[4]), k(c[5]),
        lam(c[6]), schedule(static_cast<int>(c[7])), refresh_every(static_cast<int>(c[8])),
        maximizer(static_cast<int>(c[9])), direct_maxfun(static_cast<int>(c[10])) {}
};

// DIRECT (Jones, Perttunen & Stuckman 1993, J. Optim. Theory Appl. 79:157) with the
// locally biased choice of Gablonsky & Kelley (2001, J. Global Optim. 21:27), minimising
// f over the unit cube [0, 1]^d; the stopping rules and their defaults are those of
// scipy.optimize.direct (locally_biased=True), the Python tuner's maximiser.
//
// A rectangle is its centre, f there and a level k_j per side (side 3^-k_j).  Each
// iteration groups the rectangles by their longest side (k_min; its half, sigma, is the
// size) and takes from each group the one with the lowest f (the first at a tie).  Such a
// candidate j is potentially optimal if some slope K > 0 puts it on the lower-right
// convex hull of the candidates' (sigma, f) -- K_low <= K_high with K_low the largest
// slope to a smaller candidate and K_high > 0 the smallest slope to a larger one -- and
// f_j - K_high sigma_j <= f_min - eps |f_min|.  Each potentially optimal rectangle is
// trisected along its longest sides, the side whose two new points have the lower
// min(f(c + delta e_i), f(c - delta e_i)) first, so that the best new point keeps the
// largest rectangle.  It stops after the iteration in which the evaluations reach
// `maxfun`, after `maxiter` iterations, or when the rectangle of the best point has sigma
// below `len_tol` or volume below `vol_tol`.  Returns the best centre (NaN counts as
// +inf).
struct direct_options {
  int maxfun = 2000, maxiter = 10000;
  double eps = 1e-4, len_tol = 1e-6, vol_tol = 1e-16;
};

template <class F>
std::vector<double> direct_minimise(int d, F&& objective, const direct_options& opt) {
  const auto f = [&](const double* x) {  // NaN counts as +inf (the worst)
    const double v = objective(x);
    return std::isnan(v) ? std::numeric_limits<double>::infinity() : v;
  };
  std::vector<double> centres(d, 0.5);  // d per rectangle
  std::vector<int> levels(d, 0);        // d per rectangle
  std::vector<double> values{f(centres.data())};
  std::vector<int> k_min{0};            // per rectangle: the level of its longest side
  // groups[k]: a min-heap of (f, index) of the rectangles filed under k_min = k, so that
  // the top is the lowest and, at a tie, the first made.  A rectangle leaves its group
  // only when it is cut, and then for good (its k_min grows); its entry is dropped when
  // it reaches the top (k_min no longer k).
  using entry = std::pair<double, int>;
  std::vector<std::vector<entry>> groups(1);
  const auto later = std::greater<entry>();
  groups[0].emplace_back(values[0], 0);
  std::vector<double> sigma_of{0.5};   // sigma_of[k] = 3^-k / 2
  const auto sigma = [&](int k) {
    while (static_cast<int>(sigma_of.size()) <= k) sigma_of.push_back(sigma_of.back() / 3);
    return sigma_of[k];
  };
  const auto join = [&](int r) {  // files rectangle r under its k_min
    k_min[r] = *std::min_element(levels.begin() + r * d, levels.begin() + (r + 1) * d);
    if (k_min[r] >= static_cast<int>(groups.size())) groups.resize(k_min[r] + 1);
    auto& heap = groups[k_min[r]];
    heap.emplace_back(values[r], r);
    std::push_heap(heap.begin(), heap.end(), later);
  };
  int best = 0;
  std::vector<int> group, chosen, dims, order, cut;
  std::vector<double> point(d), w(d);
  for (int iter = 0; iter < opt.maxiter && static_cast<int>(values.size()) < opt.maxfun;
       ++iter) {
    group.assign(groups.size(), -1);  // group[k]: the lowest rectangle with k_min = k
    for (size_t k = 0; k < groups.size(); ++k) {
      auto& heap = groups[k];
      while (!heap.empty() && k_min[heap.front().second] != static_cast<int>(k)) {
        std::pop_heap(heap.begin(), heap.end(), later);
        heap.pop_back();
      }
      if (!heap.empty()) group[k] = heap.front().second;
    }
    const double f_min = values[best];
    const double target = f_min - opt.eps * std::abs(f_min);
    chosen.clear();
    for (int kj = 0; kj < static_cast<int>(group.size()); ++kj) {
      const int j = group[kj];
      if (j < 0) continue;
      double k_low = -std::numeric_limits<double>::infinity();
      double k_high = std::numeric_limits<double>::infinity();
      for (int ki = 0; ki < static_cast<int>(group.size()); ++ki) {
        const int i = group[ki];
        if (i < 0 || ki == kj) continue;
        const double slope = (values[i] - values[j]) / (sigma(ki) - sigma(kj));
        if (ki > kj) {
          k_low = std::max(k_low, slope);  // a smaller rectangle
        } else {
          k_high = std::min(k_high, slope);  // a larger one
        }
      }
      if (!(k_high > 0) || k_low > k_high) continue;
      if (std::isfinite(k_high) && values[j] - k_high * sigma(kj) > target) continue;
      chosen.push_back(j);
    }
    for (const int r : chosen) {
      const int k = k_min[r];
      const double delta = 2 * sigma(k + 1);  // 3^-(k+1)
      dims.clear();  // the longest sides, in index order; pair t of new rectangles is
      for (int j = 0; j < d; ++j)  // c + delta e_j, c - delta e_j for j = dims[t]
        if (levels[r * d + j] == k) dims.push_back(j);
      const int first_new = static_cast<int>(values.size());
      for (const int j : dims) {
        for (const double sign : {1.0, -1.0}) {
          std::copy(centres.begin() + r * d, centres.begin() + (r + 1) * d, point.begin());
          point[j] += sign * delta;
          centres.insert(centres.end(), point.begin(), point.end());
          values.push_back(f(point.data()));
        }
        w[j] = std::min(values[values.size() - 2], values.back());
      }
      order.resize(dims.size());  // pairs by increasing w (ties: lower index first)
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(),
                       [&](int a, int b) { return w[dims[a]] < w[dims[b]]; });
      levels.resize(values.size() * d);
      k_min.resize(values.size());
      cut.assign(levels.begin() + r * d, levels.begin() + (r + 1) * d);
      for (const int t : order) {  // pair t keeps the sides cut so far and its own
        cut[dims[t]] += 1;
        for (int c = 0; c < 2; ++c)
          std::copy(cut.begin(), cut.end(), levels.begin() + (first_new + 2 * t + c) * d);
      }
      std::copy(cut.begin(), cut.end(), levels.begin() + r * d);  // the parent: all cut
      join(r);
      for (int r2 = first_new; r2 < static_cast<int>(values.size()); ++r2) {
        join(r2);
        if (values[r2] < values[best]) best = r2;
      }
    }
    if (chosen.empty()) break;
    int volume_level = 0;
    for (int j = 0; j < d; ++j) volume_level += levels[best * d + j];
    if (sigma(k_min[best]) < opt.len_tol || std::pow(3.0, -volume_level) < opt.vol_tol) break;
  }
  return std::vector<double>(centres.begin() + best * d, centres.begin() + (best + 1) * d);
}

// Values at points of d coordinates, found by the points' bits (open addressing, linear
// probing, keys in one flat array: no allocation per point).  Holds up to `capacity`
// points; further ones are not kept (found() then misses, which only costs a
// recomputation).
class point_memo {
 public:
  point_memo(int d, int capacity) : d_(d), capacity_(capacity) {
    size_t slots = 16;
    while (slots < 2 * static_cast<size_t>(capacity)) slots *= 2;
    slot_.assign(slots, -1);
    keys_.reserve(static_cast<size_t>(capacity) * d);
    values_.reserve(capacity);
  }

  // The value stored for x, or nullptr.
  const double* find(const double* x) const {
    for (size_t i = hash(x) & (slot_.size() - 1);; i = (i + 1) & (slot_.size() - 1)) {
      const int s = slot_[i];
      if (s < 0) return nullptr;
      if (std::memcmp(keys_.data() + static_cast<size_t>(s) * d_, x, d_ * sizeof(double)) == 0)
        return &values_[s];
    }
  }

  void insert(const double* x, double value) {
    if (static_cast<int>(values_.size()) >= capacity_) return;
    size_t i = hash(x) & (slot_.size() - 1);
    while (slot_[i] >= 0) i = (i + 1) & (slot_.size() - 1);
    slot_[i] = static_cast<int>(values_.size());
    keys_.insert(keys_.end(), x, x + d_);
    values_.push_back(value);
  }

 private:
  size_t hash(const double* x) const {
    uint64_t h = 0x9e3779b97f4a7c15ULL;
    for (int j = 0; j < d_; ++j) {
      uint64_t bits;
      std::memcpy(&bits, x + j, sizeof bits);
      h = (h ^ bits) * 0xbf58476d1ce4e5b9ULL;
      h ^= h >> 31;
    }
    return static_cast<size_t>(h);
  }

  int d_, capacity_;
  std::vector<int> slot_;
  std::vector<double> keys_, values_;
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
    carry();
    mean.noalias() = W_.leftCols(u) * means();
    var = (signal_ - q_.array()).max(0.0).matrix();
  }

  // Brings A^-1 up to date for predict_point (and the grid's posterior, if any).
  void prepare_points() {
    if (n_unique() == 0) return;
    carry();
    weights_.noalias() = Ainv_ * means();
    Eigen::LLT<mat> llt(Ainv_);  // A^-1 = R^T R: k^T A^-1 k = |R k|^2 at half the cost
    factored_ = llt.info() == Eigen::Success;
    if (factored_) R_ = llt.matrixU();
  }

  // Posterior mean and variance of f at the unit-cube point x, after prepare_points.
  void predict_point(const double* x, double& mean, double& var) {
    const int u = n_unique();
    if (u == 0) {
      mean = 0.0;
      var = signal_;
      return;
    }
    kx_.resize(u);
    for (int j = 0; j < u; ++j) kx_[j] = kernel(x, x_[j].data());
    mean = kx_.dot(weights_);
    if (factored_) {
      ak_.noalias() = R_.triangularView<Eigen::Upper>() * kx_;
      var = std::max(signal_ - ak_.squaredNorm(), 0.0);
    } else {
      ak_.noalias() = Ainv_ * kx_;
      var = std::max(signal_ - kx_.dot(ak_), 0.0);
    }
  }

 private:
  // The carried A^-1 (and the grid's W and q) brought up to the data.
  void carry() {
    update_cross_kernel();
    if (!carried_ || updates_ >= refresh_every_) {
      carry_from_scratch();
    } else {
      carry_forward();
    }
  }

  vec means() const {
    vec m(n_unique());
    for (int j = 0; j < n_unique(); ++j) m[j] = sum_[j] / count_[j];
    return m;
  }

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
  vec weights_, kx_, ak_;  // A^-1 ybar and predict_point's buffers
  mat R_;                  // A^-1 = R^T R (when factored_)
  bool factored_ = false;
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
    to_unit(x.data(), unit.data());
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

  // Box units to the unit cube (0 on a dimension of zero width).
  void to_unit(const double* x, double* unit) const {
    for (int j = 0; j < d_; ++j) unit[j] = width_[j] > 0 ? (x[j] - low_[j]) / width_[j] : 0.0;
  }

  // gamma_{i+1} = argmax of s mu + p sqrt(beta) sigma over the grid (first maximum) or by
  // DIRECT at points whose integer dimensions are rounded (as maximize_direct in
  // ahmc_stan/tuning/bayesopt.py).
  void maximise(double p_i, double b) {
    const double weight = p_i * std::sqrt(b);
    if (s_cfg_.maximizer == 1) {
      gp_.prepare_points();
      vec x(d_), unit(d_);
      // DIRECT's points differ, but once snapped (L an integer) many coincide: each
      // snapped point is predicted once per move (the same value either way).
      point_memo seen(d_, s_cfg_.direct_maxfun + 64);
      const auto negative_ucb = [&](const double* u) {
        for (int j = 0; j < d_; ++j) x[j] = low_[j] + u[j] * width_[j];
        snap(x.data(), x.data());
        if (const double* hit = seen.find(x.data())) return *hit;
        to_unit(x.data(), unit.data());
        double mean, var;
        gp_.predict_point(unit.data(), mean, var);
        const double val = s_ * mean + weight * std::sqrt(var);
        const double out = std::isfinite(val) ? -val : std::numeric_limits<double>::infinity();
        seen.insert(x.data(), out);
        return out;
      };
      direct_options options;
      options.maxfun = s_cfg_.direct_maxfun;
      const std::vector<double> u = direct_minimise(d_, negative_ucb, options);
      for (int j = 0; j < d_; ++j) x[j] = low_[j] + u[j] * width_[j];
      snap(x.data(), current_.data());
      return;
    }
    gp_.predict_grid(mean_, var_);
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
