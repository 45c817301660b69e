// The O(nk) products of the diagonal-plus-low-rank inverse metric (ahmc_bridge.cpp,
// low_rank_metric): out = a .* (u + V (c .* (V' u))), V n x k row-major with orthonormal
// columns, a optional.
//
// They are most of a leapfrog step's own work once k is in the tens (README, "AHMC
// against the best NUTS", has the measured cost).  Eigen's expression is compiled
// for the baseline x86-64 (SSE2) so that the cached libraries run on any x86-64 machine;
// on a CPU with AVX2 and FMA the same loops run with 4-wide fused multiply-adds, four rows
// of V at a time, chosen once at run time (`__builtin_cpu_supports`).  The two paths agree
// to rounding; the AVX2 one is used whenever the CPU has it (unless AHMC_NO_AVX2 is set),
// so the same seed gives the same draws on the same kind of CPU.

#pragma once

#include <Eigen/Dense>

#include <cmath>
#include <cstdlib>
#include <vector>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define AHMC_LOW_RANK_AVX2 1
#endif

namespace ahmc_low_rank {

using row_major = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

#ifdef AHMC_LOW_RANK_AVX2
// Four rows' dot products with t, 4 wide: s_m += r_m[j..] * t[j..] over j in [begin, end)
// (end - begin a multiple of 4), the rows r_m = r0 + m * stride.
__attribute__((target("avx2,fma"))) inline void dot4_accumulate(
    const double* r0, long stride, const double* t, long begin, long end, __m256d& s0,
    __m256d& s1, __m256d& s2, __m256d& s3) {
  const double *r1 = r0 + stride, *r2 = r1 + stride, *r3 = r2 + stride;
  for (long j = begin; j < end; j += 4) {
    const __m256d tj = _mm256_loadu_pd(t + j);
    s0 = _mm256_fmadd_pd(_mm256_loadu_pd(r0 + j), tj, s0);
    s1 = _mm256_fmadd_pd(_mm256_loadu_pd(r1 + j), tj, s1);
    s2 = _mm256_fmadd_pd(_mm256_loadu_pd(r2 + j), tj, s2);
    s3 = _mm256_fmadd_pd(_mm256_loadu_pd(r3 + j), tj, s3);
  }
}

// Lane m: the sum of s_m's four lanes.
__attribute__((target("avx2,fma"))) inline __m256d sum_lanes4(__m256d s0, __m256d s1,
                                                              __m256d s2, __m256d s3) {
  const __m256d h01 = _mm256_hadd_pd(s0, s1), h23 = _mm256_hadd_pd(s2, s3);
  return _mm256_add_pd(_mm256_permute2f128_pd(h01, h23, 0x20),
                       _mm256_permute2f128_pd(h01, h23, 0x31));
}

// The loops with AVX2 and FMA; t: k doubles of scratch.
__attribute__((target("avx2,fma"))) inline void product_avx2(
    long n, long k, const double* v_mat, const double* c, const double* u, const double* a,
    double* out, double* t) {
  const long k4 = k & ~3L;
  for (long j = 0; j < k; ++j) t[j] = 0.0;
  long i = 0;
  for (; i + 4 <= n; i += 4) {  // t = V' u, four rows at a time
    const double *r0 = v_mat + i * k, *r1 = r0 + k, *r2 = r1 + k, *r3 = r2 + k;
    const __m256d w0 = _mm256_set1_pd(u[i]), w1 = _mm256_set1_pd(u[i + 1]),
                  w2 = _mm256_set1_pd(u[i + 2]), w3 = _mm256_set1_pd(u[i + 3]);
    long j = 0;
    for (; j < k4; j += 4) {
      __m256d acc = _mm256_loadu_pd(t + j);
      acc = _mm256_fmadd_pd(_mm256_loadu_pd(r0 + j), w0, acc);
      acc = _mm256_fmadd_pd(_mm256_loadu_pd(r1 + j), w1, acc);
      acc = _mm256_fmadd_pd(_mm256_loadu_pd(r2 + j), w2, acc);
      acc = _mm256_fmadd_pd(_mm256_loadu_pd(r3 + j), w3, acc);
      _mm256_storeu_pd(t + j, acc);
    }
    for (; j < k; ++j)
      t[j] = std::fma(r3[j], u[i + 3], std::fma(r2[j], u[i + 2],
             std::fma(r1[j], u[i + 1], std::fma(r0[j], u[i], t[j]))));
  }
  for (; i < n; ++i)
    for (long j = 0; j < k; ++j) t[j] = std::fma(v_mat[i * k + j], u[i], t[j]);
  for (long j = 0; j < k; ++j) t[j] *= c[j];
  i = 0;
  for (; i + 4 <= n; i += 4) {  // out_i = a_i (u_i + V_i . t), four rows at a time
    const double *r0 = v_mat + i * k, *r1 = r0 + k, *r2 = r1 + k, *r3 = r2 + k;
    __m256d s0 = _mm256_setzero_pd(), s1 = s0, s2 = s0, s3 = s0;
    dot4_accumulate(r0, k, t, 0, k4, s0, s1, s2, s3);
    alignas(32) double d[4];  // lane m: row i + m
    _mm256_store_pd(d, sum_lanes4(s0, s1, s2, s3));
    for (long j = k4; j < k; ++j) {
      d[0] = std::fma(r0[j], t[j], d[0]);
      d[1] = std::fma(r1[j], t[j], d[1]);
      d[2] = std::fma(r2[j], t[j], d[2]);
      d[3] = std::fma(r3[j], t[j], d[3]);
    }
    for (int m = 0; m < 4; ++m) out[i + m] = a ? a[i + m] * (u[i + m] + d[m]) : u[i + m] + d[m];
  }
  for (; i < n; ++i) {
    double d = 0.0;
    for (long j = 0; j < k; ++j) d = std::fma(v_mat[i * k + j], t[j], d);
    out[i] = a ? a[i] * (u[i] + d) : u[i] + d;
  }
}

// Whether to take the AVX2 loops: the CPU has AVX2 and FMA, and the environment variable
// AHMC_NO_AVX2 is unset or empty when first asked (it lets a test run the baseline loops).
inline bool cpu_has_avx2() {
  static const bool has = [] {
    const char* off = std::getenv("AHMC_NO_AVX2");
    if (off && *off) return false;
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  }();
  return has;
}

// Whether to take the AVX-512 loops (gad's RMSProp step, ahmc_triangular.hpp): AVX2 loops
// are taken, the CPU has AVX-512F, and AHMC_NO_AVX512 is unset or empty when first asked
// (it lets a test run the AVX2 loops on an AVX-512 machine).
inline bool cpu_has_avx512() {
  static const bool has = [] {
    const char* off = std::getenv("AHMC_NO_AVX512");
    if (!cpu_has_avx2() || (off && *off)) return false;
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") != 0;
  }();
  return has;
}
#endif

// out = a .* (u + V (c .* (V' u))) (a null: u + V (c .* (V' u))); out must not alias u.
inline void product(const Eigen::Map<const row_major>& v_mat, const double* c,
                    const double* u, const double* a, double* out) {
  const Eigen::Index n = v_mat.rows(), k = v_mat.cols();
#ifdef AHMC_LOW_RANK_AVX2
  if (cpu_has_avx2()) {
    thread_local std::vector<double> t;
    if (static_cast<Eigen::Index>(t.size()) < k) t.resize(k);
    product_avx2(n, k, v_mat.data(), c, u, a, out, t.data());
    return;
  }
#endif
  const Eigen::Map<const Eigen::VectorXd> uu(u, n), cc(c, k);
  Eigen::Map<Eigen::VectorXd> o(out, n);
  if (a) {
    o = Eigen::Map<const Eigen::VectorXd>(a, n).cwiseProduct(
        uu + v_mat * cc.cwiseProduct(v_mat.transpose() * uu));
  } else {
    o = uu + v_mat * cc.cwiseProduct(v_mat.transpose() * uu);
  }
}

}  // namespace ahmc_low_rank
