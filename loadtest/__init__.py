"""Load tests and side-by-side benchmarks of the mesh, driven by ghz."""
