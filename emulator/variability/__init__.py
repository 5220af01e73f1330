"""Step-time variability (PRISM, arXiv 2510.15596): duration distributions per signature.

Modules: `distributions` (fit Normal, Gamma or LogNormal to repeated durations and pick by the
Kolmogorov-Smirnov statistic; moment-matched defaults where only a mean and a spread exist).
"""
