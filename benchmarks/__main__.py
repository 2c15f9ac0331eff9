"""Run every benchmark in this directory, one after another."""

from benchmarks import controlplane_start

controlplane_start.main()
