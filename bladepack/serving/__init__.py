"""Serving artifacts on real engines: Triton Inference Server (a generated model repository with the
Python backend or the C++ backend, `bladepack serve`) and Ray Serve. Nothing here is imported by the
loader; `ray` and `tritonclient` are optional extras (`serve`, `ray`)."""
