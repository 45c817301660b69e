// The O(n^2) work of the Metropolis-type samplers with a lower-triangular proposal factor
// L (ahmc_bridge.cpp, mh_chain; Titsias & Dellaportas 2019 and adaptive Metropolis): the
// products L v and L' v, gad's RMSProp step on L (Algorithm 1, the update of G and L
// row by row) and AM's rank-one update of L.  L and G are n x n row-major (AM's L
// column-major while it adapts); only their lower triangles are read.
//
// At n = 100 these are most of an iteration (a gradient of Neal's Gaussian costs less
// than either product).  The baseline loops are Eigen's, compiled for x86-64's SSE2 so
// that the cached libraries run on any x86-64 machine; where the CPU has AVX2 and FMA
// (ahmc_low_rank::cpu_has_avx2, the same switch as the low-rank metric's products and
// the same AHMC_NO_AVX2 override) the same loops run 4 wide, four rows at a time.  The
// RMSProp step is the same arithmetic in the same order on every path (no fused
// multiply-adds), 8 wide where the CPU has AVX-512F (AHMC_NO_AVX512 keeps it at 4), so
// it rounds identically on all three, as does the rank-one update; the products use
// fused multiply-adds and another summation order, so they agree with Eigen's to
// rounding.

#pragma once

#include "ahmc_low_rank.hpp"

#include <Eigen/Dense>

#include <algorithm>
#include <cmath>

namespace ahmc_triangular {

using row_major = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

#ifdef AHMC_LOW_RANK_AVX2
// out = L v, out_i = sum_{j <= i} L_ij v_j: four rows at a time, the four columns of
// their diagonal block masked right of the diagonal.
__attribute__((target("avx2,fma"))) inline void lower_times_avx2(long n, const double* l,
                                                                  const double* v, double* out) {
  const __m256d lane = _mm256_setr_pd(0.0, 1.0, 2.0, 3.0);
  const __m256d keep0 = _mm256_cmp_pd(lane, _mm256_set1_pd(0.0), _CMP_LE_OQ),
                keep1 = _mm256_cmp_pd(lane, _mm256_set1_pd(1.0), _CMP_LE_OQ),
                keep2 = _mm256_cmp_pd(lane, _mm256_set1_pd(2.0), _CMP_LE_OQ);
  long i = 0;
  for (; i + 4 <= n; i += 4) {  // rows i..i+3 share columns 0..i-1; then the block at i
    const double *r0 = l + i * n, *r1 = r0 + n, *r2 = r1 + n, *r3 = r2 + n;
    __m256d s0 = _mm256_setzero_pd(), s1 = s0, s2 = s0, s3 = s0;
    ahmc_low_rank::dot4_accumulate(r0, n, v, 0, i, s0, s1, s2, s3);
    const __m256d vi = _mm256_loadu_pd(v + i);
    s0 = _mm256_fmadd_pd(_mm256_and_pd(_mm256_loadu_pd(r0 + i), keep0), vi, s0);
    s1 = _mm256_fmadd_pd(_mm256_and_pd(_mm256_loadu_pd(r1 + i), keep1), vi, s1);
    s2 = _mm256_fmadd_pd(_mm256_and_pd(_mm256_loadu_pd(r2 + i), keep2), vi, s2);
    s3 = _mm256_fmadd_pd(_mm256_loadu_pd(r3 + i), vi, s3);
    _mm256_storeu_pd(out + i, ahmc_low_rank::sum_lanes4(s0, s1, s2, s3));
  }
  for (; i < n; ++i) {
    double d = 0.0;
    for (long j = 0; j <= i; ++j) d = std::fma(l[i * n + j], v[j], d);
    out[i] = d;
  }
}

// out = L' v, out_j = sum_{i >= j} L_ij v_i: panels of 16 columns (then 4, then single
// columns) held in registers while the rows below pass, so that L is read once and out
// written once; in a panel's triangle the entries right of the diagonal are masked out.
__attribute__((target("avx2,fma"))) inline void lower_transpose_times_avx2(
    long n, const double* l, const double* v, double* out) {
  const __m256d lane = _mm256_setr_pd(0.0, 1.0, 2.0, 3.0);
  long j0 = 0;
  for (; j0 + 16 <= n; j0 += 16) {
    __m256d a0 = _mm256_setzero_pd(), a1 = a0, a2 = a0, a3 = a0;
    for (long i = j0; i < n; ++i) {
      const double* r = l + i * n + j0;
      const __m256d vi = _mm256_set1_pd(v[i]);
      __m256d x0 = _mm256_loadu_pd(r), x1 = _mm256_loadu_pd(r + 4),
              x2 = _mm256_loadu_pd(r + 8), x3 = _mm256_loadu_pd(r + 12);
      if (i < j0 + 15) {  // keep columns j0 + c with c <= i - j0
        const __m256d k = _mm256_set1_pd(static_cast<double>(i - j0));
        x0 = _mm256_and_pd(x0, _mm256_cmp_pd(lane, k, _CMP_LE_OQ));
        x1 = _mm256_and_pd(x1, _mm256_cmp_pd(_mm256_add_pd(lane, _mm256_set1_pd(4.0)), k, _CMP_LE_OQ));
        x2 = _mm256_and_pd(x2, _mm256_cmp_pd(_mm256_add_pd(lane, _mm256_set1_pd(8.0)), k, _CMP_LE_OQ));
        x3 = _mm256_and_pd(x3, _mm256_cmp_pd(_mm256_add_pd(lane, _mm256_set1_pd(12.0)), k, _CMP_LE_OQ));
      }
      a0 = _mm256_fmadd_pd(x0, vi, a0);
      a1 = _mm256_fmadd_pd(x1, vi, a1);
      a2 = _mm256_fmadd_pd(x2, vi, a2);
      a3 = _mm256_fmadd_pd(x3, vi, a3);
    }
    _mm256_storeu_pd(out + j0, a0);
    _mm256_storeu_pd(out + j0 + 4, a1);
    _mm256_storeu_pd(out + j0 + 8, a2);
    _mm256_storeu_pd(out + j0 + 12, a3);
  }
  for (; j0 + 4 <= n; j0 += 4) {
    __m256d a0 = _mm256_setzero_pd();
    for (long i = j0; i < n; ++i) {
      __m256d x0 = _mm256_loadu_pd(l + i * n + j0);
      if (i < j0 + 3)
        x0 = _mm256_and_pd(x0, _mm256_cmp_pd(lane, _mm256_set1_pd(static_cast<double>(i - j0)),
                                             _CMP_LE_OQ));
      a0 = _mm256_fmadd_pd(x0, _mm256_set1_pd(v[i]), a0);
    }
    _mm256_storeu_pd(out + j0, a0);
  }
  for (; j0 < n; ++j0) {
    double a = 0.0;
    for (long i = j0; i < n; ++i) a = std::fma(l[i * n + j0], v[i], a);
    out[j0] = a;
  }
}

// G and L rows 0..len-1 of one row: the step with g[0..len) given.  No fused
// multiply-adds: the same roundings as the baseline below.
__attribute__((target("avx2"))) inline void rmsprop_row_avx2(long len, const double* g,
                                                            double* g_row, double* l_row,
                                                            double rate) {
  const __m256d c9 = _mm256_set1_pd(0.9), c1 = _mm256_set1_pd(0.1),
                one = _mm256_set1_pd(1.0), r = _mm256_set1_pd(rate);
  long j = 0;
  for (; j + 4 <= len; j += 4) {
    const __m256d gj = _mm256_loadu_pd(g + j);
    const __m256d gg = _mm256_add_pd(_mm256_mul_pd(c9, _mm256_loadu_pd(g_row + j)),
                                     _mm256_mul_pd(c1, _mm256_mul_pd(gj, gj)));
    _mm256_storeu_pd(g_row + j, gg);
    const __m256d step =
        _mm256_mul_pd(_mm256_div_pd(gj, _mm256_add_pd(_mm256_sqrt_pd(gg), one)), r);
    _mm256_storeu_pd(l_row + j, _mm256_add_pd(_mm256_loadu_pd(l_row + j), step));
  }
  for (; j < len; ++j) {
    g_row[j] = 0.9 * g_row[j] + 0.1 * (g[j] * g[j]);
    l_row[j] += g[j] / (std::sqrt(g_row[j]) + 1.0) * rate;
  }
}

// The same 8 wide with a masked tail (a row of L is mostly shorter than a few vectors).
// The multiplies and adds take explicit rounding (_round intrinsics) so that no compiler
// fuses them: the roundings stay those of the loops above.
#define AHMC_RN (_MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
// The lanes of `m` of one vector: G = 0.9 G + 0.1 g^2, L += g / (sqrt(G) + 1) * rate.
__attribute__((target("avx512f"))) inline void rmsprop_lanes_avx512(__mmask8 m, __m512d gj,
                                                                   double* g_row,
                                                                   double* l_row,
                                                                   __m512d rate) {
  const __m512d gg = _mm512_add_round_pd(
      _mm512_mul_round_pd(_mm512_set1_pd(0.9), _mm512_maskz_loadu_pd(m, g_row), AHMC_RN),
      _mm512_mul_round_pd(_mm512_set1_pd(0.1), _mm512_mul_round_pd(gj, gj, AHMC_RN), AHMC_RN),
      AHMC_RN);
  _mm512_mask_storeu_pd(g_row, m, gg);
  const __m512d step = _mm512_mul_round_pd(
      _mm512_div_pd(gj, _mm512_add_pd(_mm512_sqrt_pd(gg), _mm512_set1_pd(1.0))), rate,
      AHMC_RN);
  _mm512_mask_storeu_pd(l_row, m,
                        _mm512_add_round_pd(_mm512_maskz_loadu_pd(m, l_row), step, AHMC_RN));
}

// The lanes of [j, len) in the vector at j.
inline __mmask8 lanes_from(long j, long len) {
  return len - j >= 8 ? __mmask8(0xFF) : __mmask8((1u << (len - j)) - 1);
}

__attribute__((target("avx512f"))) inline void rmsprop_row_avx512(long len, const double* g,
                                                                 double* g_row, double* l_row,
                                                                 double rate) {
  const __m512d r = _mm512_set1_pd(rate);
  for (long j = 0; j < len; j += 8) {
    const __mmask8 m = lanes_from(j, len);
    rmsprop_lanes_avx512(m, _mm512_maskz_loadu_pd(m, g + j), g_row + j, l_row + j, r);
  }
}

// rmsprop_row_avx512 with g = u w (the outer product's row, gad's gradient where the
// ratio is below 1) formed in the registers instead of a buffer, and `last` added to its
// last entry: the same multiplies and adds, so the same roundings.
__attribute__((target("avx512f"))) inline void rmsprop_outer_row_avx512(
    long len, double u, const double* w, double last, double* g_row, double* l_row,
    double rate) {
  const __m512d r = _mm512_set1_pd(rate), uu = _mm512_set1_pd(u), add = _mm512_set1_pd(last);
  for (long j = 0; j < len; j += 8) {
    const __mmask8 m = lanes_from(j, len);
    __m512d gj = _mm512_mul_round_pd(uu, _mm512_maskz_loadu_pd(m, w + j), AHMC_RN);
    if (len - j <= 8) {
      gj = _mm512_mask_add_round_pd(gj, __mmask8(1u << (len - j - 1)), gj, add, AHMC_RN);
    }
    rmsprop_lanes_avx512(m, gj, g_row + j, l_row + j, r);
  }
}

// x[0..len) *= c
__attribute__((target("avx512f"))) inline void scale_row_avx512(long len, double* x, double c) {
  const __m512d cc = _mm512_set1_pd(c);
  for (long j = 0; j < len; j += 8) {
    const __mmask8 m = lanes_from(j, len);
    _mm512_mask_storeu_pd(x + j, m, _mm512_mul_round_pd(cc, _mm512_maskz_loadu_pd(m, x + j), AHMC_RN));
  }
}
#undef AHMC_RN

// One column of the rank-one Cholesky update (adaptive Metropolis): for i in [0, len),
// col_i = (col_i + s t_i) / c, then t_i = c t_i - s col_i.  No fused multiply-adds: the
// same roundings as the baseline.
__attribute__((target("avx2"))) inline void rank_one_column_avx2(long len, double* col,
                                                                double* t, double c, double s) {
  const __m256d cc = _mm256_set1_pd(c), ss = _mm256_set1_pd(s);
  long i = 0;
  for (; i + 4 <= len; i += 4) {
    const __m256d ti = _mm256_loadu_pd(t + i);
    const __m256d li = _mm256_div_pd(_mm256_add_pd(_mm256_loadu_pd(col + i), _mm256_mul_pd(ss, ti)), cc);
    _mm256_storeu_pd(col + i, li);
    _mm256_storeu_pd(t + i, _mm256_sub_pd(_mm256_mul_pd(cc, ti), _mm256_mul_pd(ss, li)));
  }
  for (; i < len; ++i) {
    col[i] = (col[i] + s * t[i]) / c;
    t[i] = c * t[i] - s * col[i];
  }
}
#endif

// out = L v (out must not alias v)
inline void lower_times(const Eigen::Map<row_major>& l, const double* v, double* out) {
  const long n = l.rows();
#ifdef AHMC_LOW_RANK_AVX2
  if (ahmc_low_rank::cpu_has_avx2()) return lower_times_avx2(n, l.data(), v, out);
#endif
  Eigen::Map<Eigen::VectorXd>(out, n).noalias() =
      l.triangularView<Eigen::Lower>() * Eigen::Map<const Eigen::VectorXd>(v, n);
}

// out = L' v (out must not alias v)
inline void lower_transpose_times(const Eigen::Map<row_major>& l, const double* v, double* out) {
  const long n = l.rows();
#ifdef AHMC_LOW_RANK_AVX2
  if (ahmc_low_rank::cpu_has_avx2()) return lower_transpose_times_avx2(n, l.data(), v, out);
#endif
  Eigen::Map<Eigen::VectorXd>(out, n).noalias() =
      l.triangularView<Eigen::Lower>().transpose() * Eigen::Map<const Eigen::VectorXd>(v, n);
}

// G = 0.9 G + 0.1 g^2 and L += g / (sqrt(G) + 1) * rate over one row's first `len`
// entries (gad.GadProposal.adapt's RMSProp step, elementwise).
inline void rmsprop_row(long len, const double* g, double* g_row, double* l_row, double rate) {
#ifdef AHMC_LOW_RANK_AVX2
  if (ahmc_low_rank::cpu_has_avx512()) return rmsprop_row_avx512(len, g, g_row, l_row, rate);
  if (ahmc_low_rank::cpu_has_avx2()) return rmsprop_row_avx2(len, g, g_row, l_row, rate);
#endif
  const Eigen::Map<const Eigen::ArrayXd> gg(g, len);
  Eigen::Map<Eigen::ArrayXd> gr(g_row, len), lr(l_row, len);
  gr = 0.9 * gr + 0.1 * gg.square();
  lr += gg / (gr.sqrt() + 1.0) * rate;
}

// rmsprop_row with g[j] = u w[j] for j < len - 1 and g[len - 1] = u w[len - 1] + last;
// `g` (len entries) is scratch for the paths that form it in memory.
inline void rmsprop_outer_row(long len, double u, const double* w, double last, double* g,
                              double* g_row, double* l_row, double rate) {
#ifdef AHMC_LOW_RANK_AVX2
  if (ahmc_low_rank::cpu_has_avx512()) {
    return rmsprop_outer_row_avx512(len, u, w, last, g_row, l_row, rate);
  }
#endif
  Eigen::Map<Eigen::ArrayXd> gg(g, len);
  gg = u * Eigen::Map<const Eigen::ArrayXd>(w, len);
  gg[len - 1] += last;
  rmsprop_row(len, g, g_row, l_row, rate);
}

// x[0..len) *= c
inline void scale_row(long len, double* x, double c) {
#ifdef AHMC_LOW_RANK_AVX2
  if (ahmc_low_rank::cpu_has_avx512()) return scale_row_avx512(len, x, c);
#endif
  Eigen::Map<Eigen::ArrayXd>(x, len) *= c;
}

// L' L'^T = L L^T + v v^T for a lower-triangular L stored column-major (n x n, columns
// contiguous), v overwritten (Givens rotations, column by column; baselines.
// cholesky_rank_one_update).
inline void rank_one_update_col_major(long n, double* l, double* v) {
  for (long k = 0; k < n; ++k) {
    double* col = l + k * n;
    const double lkk = col[k], r = std::hypot(lkk, v[k]);
    const double c = r / lkk, s = v[k] / lkk;
    col[k] = r;
    const long len = n - k - 1;
#ifdef AHMC_LOW_RANK_AVX2
    if (ahmc_low_rank::cpu_has_avx2()) {
      rank_one_column_avx2(len, col + k + 1, v + k + 1, c, s);
      continue;
    }
#endif
    for (long i = k + 1; i < n; ++i) {
      col[i] = (col[i] + s * v[i]) / c;
      v[i] = c * v[i] - s * col[i];
    }
  }
}

}  // namespace ahmc_triangular
