// Rank-normalised split R-hat, bulk and tail ESS and the MCSEs of the mean and sd of
// many columns (Vehtari, Gelman, Simpson, Carpenter & Buerkner 2021, Bayesian Analysis
// 16:667, sections 3-4), as ahmc_stan/rank_diagnostics.py computes them with numpy,
// fused per column: one sort of the split draws (by buckets between the extremes, or
// radix where the draws crowd) gives the normal scores, the tail quantiles and the tail
// indicators' rarer positions and, merging its two halves about the median, the folded
// draws' order; the autocovariances are summed lag by lag up to Geyer's truncation.
// Plain C++17, no Stan: built on its own by ahmc_stan.compiler.diagnostics_library().  A
// column this does not finish (a value that is not finite, or autocorrelations that
// reach past MAX_LAGS) is flagged for the numpy path.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

namespace {

constexpr int MAX_LAGS = 96;  // summed lags per series, beyond them the FFT path serves
constexpr double RESOLUTION = 1e-15;  // np.finfo(float).resolution
constexpr double CANCELLATION = 0.05;  // mcse_sd: left to numpy below it (see mcse)

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
  std::vector<double> sorted, z, folded, indicator, dev, pairs, squares;
  std::vector<uint32_t> count, bucket_start, first, next;
  std::vector<double> series_mean;
  Series series, folded_series;  // of the normal scores z and of the folded draws' scores
  Series raw;  // of the draws themselves or of their squared deviations (the MCSEs)
  void size(int n, int m) {
    key.resize(n); key2.resize(n); order.resize(n); order2.resize(n); merged.resize(n);
    sorted.resize(n); z.resize(n); folded.resize(n); indicator.resize(n); dev.resize(n);
    pairs.resize(n); squares.resize(n);
    count.assign(1 << 11, 0);
    bucket_start.resize(n + 1);
    first.resize(m + 1);
    next.resize(m);
    series_mean.resize(m);
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

// Ascending order of v[0..n) as radix_order gives it (ties in any order): the values in
// n buckets by linear interpolation between the least and the greatest (a bucket is
// monotone in the value), then one insertion sort over all of them, which moves a value
// only within its bucket.  For draws of any smooth density the buckets hold a few values
// each; where they crowd (heavy tails: the insertion sort's work, the sum of the
// buckets' squared sizes, above 8 n) radix_order sorts instead.
void value_order(const double* v, int n, Scratch& s) {
  double lo = v[0], hi = v[0];
  for (int i = 1; i < n; ++i) {
    lo = v[i] < lo ? v[i] : lo;
    hi = v[i] > hi ? v[i] : hi;
  }
  const double scale = n / (hi - lo);
  if (!(hi > lo) || !std::isfinite(hi - lo) || !std::isfinite(scale))
    return radix_order(v, n, s);
  uint32_t* bucket = s.order2.data();
  uint32_t* start = s.bucket_start.data();
  std::memset(start, 0, (n + 1) * sizeof(uint32_t));
  for (int i = 0; i < n; ++i) {
    const double at = (v[i] - lo) * scale;
    const uint32_t b = at < n - 1 ? static_cast<uint32_t>(at) : static_cast<uint32_t>(n - 1);
    bucket[i] = b;
    ++start[b + 1];
  }
  double work = 0.0;
  for (int b = 1; b <= n; ++b) work += static_cast<double>(start[b]) * start[b];
  if (work > 8.0 * n) return radix_order(v, n, s);
  for (int b = 1; b <= n; ++b) start[b] += start[b - 1];
  uint64_t* key = s.key.data();
  uint32_t* order = s.order.data();
  for (int i = 0; i < n; ++i) {
    const uint32_t p = start[bucket[i]]++;
    key[p] = sort_key(v[i]);
    order[p] = static_cast<uint32_t>(i);
  }
  for (int i = 1; i < n; ++i) {
    const uint64_t k = key[i];
    if (key[i - 1] <= k) continue;
    const uint32_t o = order[i];
    int j = i;
    do {
      key[j] = key[j - 1];
      order[j] = order[j - 1];
      --j;
    } while (j > 0 && key[j - 1] > k);
    key[j] = k;
    order[j] = o;
  }
  for (int i = 0; i < n; ++i) s.sorted[i] = v[order[i]];
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

// ESS of the indicator x <= q of the m series of h values that s.sorted and s.order hold
// sorted (value_order), every lag's autocovariance from the positions of the rarer value
// (ones or zeros: the complement's autocovariances are the same) counted exactly: with J
// that indicator, c its ones and mu = c / h, the sum over i < h - t of
// (J_i - mu)(J_i+t - mu) is pairs_t - mu (ones below h - t + ones from t) + (h - t) mu^2.
// The ones are the sorted draws up to q, the rarer value's positions those of the sorted
// draws on its side; a lag's autocovariance is summed when Geyer's truncation asks for it.
// NaN (left to the FFT) where the pairs would outnumber its work: many ties at a
// quantile in long chains.
double indicator_ess(double q, int m, int h, Scratch& s) {
  const int size = m * h;
  const double* o = s.sorted.data();
  const int ones = static_cast<int>(std::upper_bound(o, o + size, q) - o);
  if (ones == 0 || ones == size) return size;
  const bool rare_one = 2 * ones <= size;
  const int rare = rare_one ? ones : size - ones;  // pairs to count: about rare^2 / 2m
  if (static_cast<double>(rare) * rare > 64.0 * m * size) return std::nan("");
  // the rarer value's positions by series (a counting sort: series k's are
  // at[first[k] .. first[k + 1])), ascending within each
  const uint32_t* index = s.order.data() + (rare_one ? 0 : ones);
  uint32_t* at = s.merged.data();
  uint32_t* first = s.first.data();
  uint32_t* next = s.next.data();
  std::fill(first, first + m + 1, 0u);
  for (int p = 0; p < rare; ++p) ++first[index[p] / h + 1];
  for (int k = 0; k < m; ++k) first[k + 1] += first[k];
  for (int k = 0; k < m; ++k) next[k] = first[k];
  for (int p = 0; p < rare; ++p) {
    const uint32_t k = index[p] / h;
    at[next[k]++] = index[p] - k * h;
  }
  for (int k = 0; k < m; ++k) std::sort(at + first[k], at + first[k + 1]);
  double* pairs = s.pairs.data();  // series k's pairs at each distance: pairs[k h + t]
  std::fill(pairs, pairs + size, 0.0);
  for (int k = 0; k < m; ++k) {
    const uint32_t* pos = at + first[k];
    const int c = first[k + 1] - first[k];
    double* pk = pairs + static_cast<size_t>(k) * h;
    for (int a = 0; a < c; ++a)
      for (int b = a; b < c; ++b) pk[pos[b] - pos[a]] += 1.0;
    const double mu = static_cast<double>(c) / h;
    s.series_mean[k] = rare_one ? mu : 1.0 - mu;
  }
  auto below = [&](int k, int i) {  // series k's rarer value at positions before i
    const uint32_t* pos = at + first[k];
    const uint32_t* end = at + first[k + 1];
    return static_cast<double>(std::lower_bound(pos, end, static_cast<uint32_t>(i)) - pos);
  };
  auto acov = [&](int t) {
    double total = 0.0;
    for (int k = 0; k < m; ++k) {
      const int c = first[k + 1] - first[k];
      const double mu = static_cast<double>(c) / h;
      total += (pairs[static_cast<size_t>(k) * h + t] -
                mu * (below(k, h - t) + (c - below(k, t))) + (h - t) * mu * mu) / h;
    }
    return total / m;
  };
  return geyer(m, h, acov(0), m > 1 ? variance(s.series_mean) : 0.0, h, acov);
}

// Type-7 quantile of sorted values (rank_diagnostics._quantile_ess).
double quantile(const double* sorted, int n, double prob) {
  const double aleph = n * prob + (1.0 - prob);
  const int k = static_cast<int>(std::floor(std::min(std::max(aleph, 1.0), n - 1.0)));
  const double gamma = std::min(std::max(aleph - k, 0.0), 1.0);
  return (1.0 - gamma) * sorted[k - 1] + gamma * sorted[k];
}

// numpy's default (linear) quantile of sorted values, in its arithmetic (the lerp from
// the nearer end), as rank_diagnostics.row_quantiles computes it.
double linear_quantile(const double* sorted, int n, double prob) {
  const double virt = (n - 1) * prob;
  const double below = std::min(std::max(std::floor(virt), 0.0), n - 1.0);
  const double above = std::min(std::max(below + 1.0, 0.0), n - 1.0);
  const double gamma = virt - below;
  const double a = sorted[static_cast<int>(below)], b = sorted[static_cast<int>(above)];
  const double diff = b - a;
  return gamma >= 0.5 ? b - diff * (1.0 - gamma) : a + diff * gamma;
}

// The MCSEs of the mean and of the sd of the n = m h draws (rank_diagnostics._mcse_mean,
// _mcse_sd, as arviz.mcse computes them): the sd over the ESS of the split draws, and
// from the ESS of the split squared deviations from the mean and their variance, the
// mean fourth power less the squared variance; each written, and its bit (16, 32) set in
// done, unless its ESS reaches past MAX_LAGS (then the FFT's) or, for the sd's, that
// variance is below CANCELLATION of the mean fourth power: squared deviations nearly
// constant, as for draws of 0 and 1 near half and half, whose variance and ESS are
// differences of nearly equal sums, their last digits set by the order of summation;
// numpy's sums, which ArviZ shares, compute those.
void mcse(const double* x, int m, int h, int want, Scratch& s, double& out_mean,
          double& out_sd, int& done) {
  const int n = m * h;
  double sum = 0.0;
  for (int i = 0; i < n; ++i) sum += x[i];
  const double mean = sum / n;
  double ss = 0.0;
  for (int i = 0; i < n; ++i) ss += (x[i] - mean) * (x[i] - mean);
  if (want & 16) {
    series_moments(x, m, h, s.raw);
    const double e = ess(x, m, h, s.raw, s.dev);
    if (!std::isnan(e)) {
      out_mean = std::sqrt(ss / (n - 1)) / std::sqrt(e);
      done |= 16;
    }
  }
  if (want & 32) {
    double* sq = s.squares.data();
    double fourth = 0.0;
    for (int i = 0; i < n; ++i) {
      sq[i] = (x[i] - mean) * (x[i] - mean);
      fourth += sq[i] * sq[i];
    }
    const double evar = ss / n, spread = fourth / n - evar * evar;
    if (spread > CANCELLATION * fourth / n) {
      series_moments(sq, m, h, s.raw);
      const double e = ess(sq, m, h, s.raw, s.dev);
      if (!std::isnan(e)) {
        out_sd = std::sqrt(spread / e / evar / 4);
        done |= 32;
      }
    }
  }
}

}  // namespace

extern "C" {

// For each of k columns of x (k, chains, draws; C order; draws even), with m = 2 chains
// series of h = draws / 2 (the split) and table the 2 m h - 1 normal scores: out_bulk,
// out_tail, out_rhat, out_mcse_mean, out_mcse_sd (want: bit 1 bulk, 2 tail, 4 R-hat, 16
// MCSE of the mean, 32 of the sd) and in done[c] the bits of those computed; the numpy
// path computes the rest (a column with a value that is not finite; a tail ESS with more
// pairs to count than the FFT's work; an MCSE whose ESS reaches past MAX_LAGS, or of the
// sd where its variance cancels, see mcse; R-hat of one chain is nan).  A finite column's
// bulk ESS whose truncation lies past MAX_LAGS is left too, its normal scores (2 chains
// series of h, each chain's halves in turn) written to z_out (k rows of 2 m h) unless it
// is null, and bit 8 set.  With n_probs > 0, each finite column's quantiles at probs
// (numpy's default method, from the same sort) in quantiles_out (k rows of n_probs), and
// bit 64 set.
int ahmc_rank_diagnostics(const double* x, int k, int chains, int draws, const double* table,
                          int want, double* out_bulk, double* out_tail, double* out_rhat,
                          double* out_mcse_mean, double* out_mcse_sd, int* done,
                          double* z_out, const double* probs, int n_probs,
                          double* quantiles_out) {
  if (draws % 2 != 0 || draws < 4 || chains < 1) return 1;
  const int h = draws / 2, m = 2 * chains, n = m * h;
  Scratch s;
  s.size(n, m);
  for (int c = 0; c < k; ++c) {
    const double* col = x + static_cast<size_t>(c) * n;
    done[c] = 0;
    out_bulk[c] = out_tail[c] = out_rhat[c] = std::nan("");
    if (want & 16) out_mcse_mean[c] = std::nan("");
    if (want & 32) out_mcse_sd[c] = std::nan("");
    bool finite = true;
    for (int i = 0; i < n && finite; ++i) finite = std::isfinite(col[i]);
    if (!finite) continue;
    if (want & (16 | 32)) mcse(col, m, h, want, s, out_mcse_mean[c], out_mcse_sd[c], done[c]);
    if (!(want & 7) && n_probs <= 0) continue;
    value_order(col, n, s);  // each chain's halves in turn: the split draws
    if (n_probs > 0) {
      for (int j = 0; j < n_probs; ++j)
        quantiles_out[static_cast<size_t>(c) * n_probs + j] =
            linear_quantile(s.sorted.data(), n, probs[j]);
      done[c] |= 64;
    }
    if (!(want & 7)) continue;
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
      double low = indicator_ess(quantile(s.sorted.data(), n, 0.05), m, h, s);
      double high = indicator_ess(quantile(s.sorted.data(), n, 0.95), m, h, s);
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
