"""Run every benchmark in this directory, one after another."""

from benchmarks import controlplane_start, runtime

controlplane_start.main()
runtime.main()
