// Rank-normalised split R-hat and bulk and tail ESS of many columns (Vehtari, Gelman,
// Simpson, Carpenter & Buerkner 2021, Bayesian Analysis 16:667, sections 3-4), as
// ahmc_stan/rank_diagnostics.py computes them with numpy, fused per column: one radix
// sort of the split draws gives the normal scores, the tail quantiles and, merging its
// two halves about the median, the folded draws' order; the autocovariances are summed
// lag by lag up to Geyer's truncation.  Plain C++17, no Stan: built on its own by
// ahmc_stan.compiler.diagnostics_library().  A column this does not finish (a value
// that is not finite, or autocorrelations that reach past MAX_LAGS) is flagged for the
// numpy path.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

namespace {

constexpr int MAX_LAGS = 96;  // summed lags per series, beyond them the FFT path serves
constexpr double RESOLUTION = 1e-15;  // np.finfo(float).resolution

inline uint64_t sort_key(double v) {
  v += 0.0;  // -0.0 sorts with +0.0, as numpy's sort treats them equal
  uint64_t u;
  std::memcpy(&u, &v, sizeof u);
  return (u >> 63) ? ~u : (u | 0x8000000000000000ULL);
}

// The means of m series of h values each and their mean within-series variance (ddof 1),
// shared by the split R-hat and the ESS of the same values.
struct Series {
  std::vector<double> means;
  double within = 0.0;
};

struct Scratch {
  std::vector<uint64_t> key, key2;
  std::vector<uint32_t> order, order2, merged;
  std::vector<double> sorted, z, folded, indicator, dev, acov, pairs, below;
  std::vector<uint32_t> count;
  Series series, folded_series;  // of the normal scores z and of the folded draws' scores
  void size(int n) {
    key.resize(n); key2.resize(n); order.resize(n); order2.resize(n); merged.resize(n);
    sorted.resize(n); z.resize(n); folded.resize(n); indicator.resize(n); dev.resize(n);
    below.resize(n + 1);
    count.assign(1 << 11, 0);
  }
};

// Ascending order of v[0..n) (LSD radix sort on 11-bit digits, a digit all keys share
// skipped): s.order, and the sorted values in s.sorted.
void radix_order(const double* v, int n, Scratch& s) {
  constexpr int BITS = 11, RADIX = 1 << BITS;
  for (int i = 0; i < n; ++i) {
    s.key[i] = sort_key(v[i]);
    s.order[i] = static_cast<uint32_t>(i);
  }
  uint64_t* a = s.key.data();
  uint64_t* b = s.key2.data();
  uint32_t* oa = s.order.data();
  uint32_t* ob = s.order2.data();
  for (int shift = 0; shift < 64; shift += BITS) {
    uint32_t* c = s.count.data();
    std::memset(c, 0, RADIX * sizeof(uint32_t));
    for (int i = 0; i < n; ++i) ++c[(a[i] >> shift) & (RADIX - 1)];
    if (c[(a[0] >> shift) & (RADIX - 1)] == static_cast<uint32_t>(n)) continue;
    uint32_t total = 0;
    for (int d = 0; d < RADIX; ++d) {
      uint32_t k = c[d];
      c[d] = total;
      total += k;
    }
    for (int i = 0; i < n; ++i) {
      uint32_t p = c[(a[i] >> shift) & (RADIX - 1)]++;
      b[p] = a[i];
      ob[p] = oa[i];
    }
    std::swap(a, b);
    std::swap(oa, ob);
  }
  if (oa != s.order.data()) std::memcpy(s.order.data(), oa, n * sizeof(uint32_t));
  for (int i = 0; i < n; ++i) s.sorted[i] = v[s.order[i]];
}

// Normal scores of the ranks of the values ``sorted`` (ascending) at positions ``order``:
// out[order[j]] = table[2 r - 2] for rank r of sorted[j], ties given their mean rank
// (table: Blom's scores of ranks 1, 1.5, ..., n).
void scores(const double* sorted, const uint32_t* order, int n, const double* table,
            double* out) {
  int start = 0;
  while (start < n) {
    int end = start + 1;
    while (end < n && sorted[end] == sorted[start]) ++end;
    double score = table[2 * start + (end - start) - 1];
    for (int j = start; j < end; ++j) out[order[j]] = score;
    start = end;
  }
}

// The Series of m series of h values each, x's first h values the first series.
void series_moments(const double* x, int m, int h, Series& out) {
  out.means.resize(m);
  double within = 0.0;
  for (int s = 0; s < m; ++s) {
    const double* xs = x + static_cast<size_t>(s) * h;
    double sum = 0.0;
    for (int i = 0; i < h; ++i) sum += xs[i];
    double mean = sum / h, ss = 0.0;
    for (int i = 0; i < h; ++i) ss += (xs[i] - mean) * (xs[i] - mean);
    out.means[s] = mean;
    within += ss / (h - 1);
  }
  out.within = within / m;
}

// Split R-hat from the series' moments (rank_diagnostics._rhat_plain).
double rhat_plain(const Series& series, int m, int h) {
  double grand = 0.0;
  for (double v : series.means) grand += v;
  grand /= m;
  double between = 0.0;
  for (double v : series.means) between += (v - grand) * (v - grand);
  between = h * between / (m - 1);
  return std::sqrt((between / series.within + h - 1) / h);
}

// ESS from the series' mean autocovariance ``acov(lag)`` (sums over h), lag 0's
// ``acov0`` and the variance of the series' means (rank_diagnostics._ess: Geyer's
// initial monotone sequence of the mean autocorrelations); NaN when the truncation lies
// past ``max_lag``.
template <class Acov>
double geyer(int m, int h, double acov0, double between, int max_lag, Acov acov) {
  const int size = m * h;
  const double mean_var = acov0 * h / (h - 1.0);
  double var_plus = mean_var * (h - 1.0) / h;
  if (m > 1) var_plus += between;
  auto rho = [&](int lag) {
    return lag == 0 ? 1.0 : 1.0 - (mean_var - acov(lag)) / var_plus;
  };
  const int n_pairs = std::max((h - 3) / 2 + 1, 1);
  // Pair j = rho(2j) + rho(2j+1); J: 1 + the first pair whose sum is not > 0 or beyond
  // the bound 2j + 1 >= h - 3, else n_pairs.
  double running_min = 0.0, body = 0.0, last_even = 1.0, last_sum = 0.0;
  int J = n_pairs;
  for (int j = 0; j < n_pairs; ++j) {
    if (2 * j + 1 > max_lag) return std::nan("");
    const double even = rho(2 * j), pair = even + rho(2 * j + 1);
    running_min = j == 0 ? pair : std::min(running_min, pair);
    last_even = even;
    last_sum = pair;
    const bool goes_on = j < n_pairs - 1 && pair > 0.0 && 2 * (j + 1) - 1 < h - 3;
    if (!goes_on) {
      J = j + 1;
      break;
    }
    body += running_min;  // pairs 0 .. J-2, made monotone
  }
  if (J == 1) last_even = 1.0;
  const bool keep_even = J == 1 || last_sum >= 0.0 || last_even > 0.0;
  double tau = -1.0 + 2.0 * body + (keep_even ? last_even : 0.0);
  tau = std::max(tau, 1.0 / std::log10(static_cast<double>(size)));
  return size / tau;
}

// The sample variance (ddof 1) of the values.
double variance(const std::vector<double>& v) {
  double mean = 0.0, ss = 0.0;
  for (double x : v) mean += x;
  mean /= v.size();
  for (double x : v) ss += (x - mean) * (x - mean);
  return ss / (v.size() - 1.0);
}

// ESS of m series of h values with moments `series` (the autocovariances summed lag by
// lag); a column that does not vary: its draws; NaN past MAX_LAGS.
double ess(const double* x, int m, int h, const Series& series, std::vector<double>& dev) {
  const int size = m * h;
  double lo = x[0], hi = x[0];
  for (int i = 1; i < size; ++i) {
    lo = x[i] < lo ? x[i] : lo;
    hi = x[i] > hi ? x[i] : hi;
  }
  if (hi - lo < RESOLUTION) return size;
  const std::vector<double>& means = series.means;
  for (int s = 0; s < m; ++s) {
    const double* xs = x + static_cast<size_t>(s) * h;
    for (int i = 0; i < h; ++i) dev[s * h + i] = xs[i] - means[s];
  }
  auto mean_acov = [&](int lag) {
    double total = 0.0;
    for (int s = 0; s < m; ++s) {
      const double* d = dev.data() + static_cast<size_t>(s) * h;
      double sum = 0.0;
      for (int i = 0; i + lag < h; ++i) sum += d[i] * d[i + lag];
      total += sum / h;
    }
    return total / m;
  };
  return geyer(m, h, mean_acov(0), m > 1 ? variance(means) : 0.0, MAX_LAGS, mean_acov);
}

// ESS of the indicator x <= q of m series of h values, every lag's autocovariance from
// the positions of the rarer value (ones or zeros: the complement's autocovariances are
// the same) counted exactly: with J that indicator, c its ones and mu = c / h, the sum
// over i < h - t of (J_i - mu)(J_i+t - mu) is pairs_t - mu (ones below h - t + ones from
// t) + (h - t) mu^2.  NaN (left to the FFT) where the pairs would outnumber its work:
// many ties at a quantile in long chains.
double indicator_ess(const double* x, double q, int m, int h, Scratch& s) {
  const int size = m * h;
  int ones = 0;
  for (int i = 0; i < size; ++i) ones += x[i] <= q;
  if (ones == 0 || ones == size) return size;
  const bool rare_one = 2 * ones <= size;
  const double rare = rare_one ? ones : size - ones;  // pairs to count: about rare^2 / 2m
  if (rare * rare > 64.0 * m * size) return std::nan("");  // more than the FFT costs
  std::vector<double> means(m);
  s.acov.assign(h, 0.0);
  for (int k = 0; k < m; ++k) {
    const double* xs = x + static_cast<size_t>(k) * h;
    uint32_t* at = s.merged.data();
    int c = 0;
    for (int i = 0; i < h; ++i)
      if ((xs[i] <= q) == rare_one) at[c++] = static_cast<uint32_t>(i);
    const double mu = static_cast<double>(c) / h;
    means[k] = rare_one ? mu : 1.0 - mu;
    s.pairs.assign(h, 0.0);
    for (int a = 0; a < c; ++a)
      for (int b = a; b < c; ++b) s.pairs[at[b] - at[a]] += 1.0;
    for (int i = 0, p = 0; i <= h; ++i) {  // below[i]: ones at positions before i
      while (p < c && static_cast<int>(at[p]) < i) ++p;
      s.below[i] = p;
    }
    for (int t = 0; t < h; ++t)
      s.acov[t] += (s.pairs[t] - mu * (s.below[h - t] + (c - s.below[t])) +
                    (h - t) * mu * mu) / h;
  }
  for (double& a : s.acov) a /= m;
  return geyer(m, h, s.acov[0], m > 1 ? variance(means) : 0.0, h,
               [&](int lag) { return s.acov[lag]; });
}

// Type-7 quantile of sorted values (rank_diagnostics._quantile_ess).
double quantile(const double* sorted, int n, double prob) {
  const double aleph = n * prob + (1.0 - prob);
  const int k = static_cast<int>(std::floor(std::min(std::max(aleph, 1.0), n - 1.0)));
  const double gamma = std::min(std::max(aleph - k, 0.0), 1.0);
  return (1.0 - gamma) * sorted[k - 1] + gamma * sorted[k];
}

}  // namespace

extern "C" {

// For each of k columns of x (k, chains, draws; C order; draws even), with m = 2 chains
// series of h = draws / 2 (the split) and table the 2 m h - 1 normal scores: out_bulk,
// out_tail, out_rhat (want: bit 1 bulk, 2 tail, 4 R-hat) and in done[c] the bits of those
// computed; the numpy path computes the rest (a column with a value that is not finite;
// a tail ESS with more pairs to count than the FFT's work; R-hat of one chain is nan).  A finite column's bulk ESS whose truncation lies past
// MAX_LAGS is left too, its normal scores (2 chains series of h, each chain's halves
// in turn) written to z_out (k rows of 2 m h) unless it is null, and bit 8 set.
int ahmc_rank_diagnostics(const double* x, int k, int chains, int draws, const double* table,
                          int want, double* out_bulk, double* out_tail, double* out_rhat,
                          int* done, double* z_out) {
  if (draws % 2 != 0 || draws < 4 || chains < 1) return 1;
  const int h = draws / 2, m = 2 * chains, n = m * h;
  Scratch s;
  s.size(n);
  for (int c = 0; c < k; ++c) {
    const double* col = x + static_cast<size_t>(c) * n;
    done[c] = 0;
    out_bulk[c] = out_tail[c] = out_rhat[c] = std::nan("");
    bool finite = true;
    for (int i = 0; i < n && finite; ++i) finite = std::isfinite(col[i]);
    if (!finite) continue;
    radix_order(col, n, s);  // each chain's halves in turn: the split draws
    scores(s.sorted.data(), s.order.data(), n, table, s.z.data());
    const bool rhat = (want & 4) && chains >= 2;
    if ((want & 1) || rhat) series_moments(s.z.data(), m, h, s.series);
    if (want & 1) {
      out_bulk[c] = ess(s.z.data(), m, h, s.series, s.dev);
      if (!std::isnan(out_bulk[c]))
        done[c] |= 1;
      else if (z_out != nullptr) {  // the scores, for the FFT's ESS
        std::memcpy(z_out + static_cast<size_t>(c) * n, s.z.data(), n * sizeof(double));
        done[c] |= 8;
      }
    }
    if (want & 2) {
      double low = indicator_ess(col, quantile(s.sorted.data(), n, 0.05), m, h, s);
      double high = indicator_ess(col, quantile(s.sorted.data(), n, 0.95), m, h, s);
      if (!std::isnan(low) && !std::isnan(high)) {
        out_tail[c] = high < low ? high : low;
        done[c] |= 2;
      }
    }
    if (rhat) {
      // The folded draws |x - median| in ascending order: the draws at or below the
      // median from the median down, merged with those above it from the median up.
      const double* o = s.sorted.data();
      const double median = (o[n / 2 - 1] + o[n / 2]) / 2;
      int b = 0;
      while (b < n && o[b] <= median) ++b;
      int lo = b - 1, hi = b, j = 0;
      while (lo >= 0 || hi < n) {
        const bool take_lo = hi >= n || (lo >= 0 && std::fabs(o[lo] - median) <=
                                                       std::fabs(o[hi] - median));
        const int p = take_lo ? lo-- : hi++;
        s.folded[j] = std::fabs(o[p] - median);
        s.merged[j++] = s.order[p];
      }
      scores(s.folded.data(), s.merged.data(), n, table, s.indicator.data());
      const double bulk = rhat_plain(s.series, m, h);
      series_moments(s.indicator.data(), m, h, s.folded_series);
      const double tail = rhat_plain(s.folded_series, m, h);
      out_rhat[c] = tail > bulk ? tail : bulk;
      done[c] |= 4;
    }
  }
  return 0;
}

}  // extern "C"
