// Two normal components 3 apart, the second holding 1e-4 of the mass, behind a barrier
// of about 12 nats that no HMC chain crosses: a chain started in its basin (x above
// about -0.28) stays there.  Used to test ahmc_stan.chain_rerun.
parameters {
  real x;
}
model {
  target += log_mix(0.9999, normal_lpdf(x | -1.5, 0.3), normal_lpdf(x | 1.5, 0.3));
}
