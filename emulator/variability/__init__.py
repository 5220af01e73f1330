"""Step-time variability (PRISM, arXiv 2510.15596): the distribution of a job's step time.

Modules: `distributions` (fit Normal, Gamma or LogNormal to repeated durations and pick by the
Kolmogorov-Smirnov statistic; moment-matched defaults where only a mean and a spread exist),
`model` (the spatial, temporal, collective and network knobs and their cited defaults),
`regimes` (Otsu splits: pipeline bubble / no-bubble transfers, network regimes), `sampling`
(seeded draws), `monte_carlo` (N samples over the mesh-vectorized replay), `summary` (the
figures a user reads: percentiles, P(step > T), K-step bound, slowdown), `sources` (the noise
sources, one mask each), `signatures` (a source split into its op or collective signatures),
`attribution` (the sources ranked by the variance each gives alone, the top ones split),
`placement` (k slow GPUs placed in one TP group, one stage, or spread over DP replicas).
"""
