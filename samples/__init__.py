"""Sample models with dynamic shapes, used by the demo, the tests and the benchmarks."""
