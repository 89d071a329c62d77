#!/bin/sh
# Stand-in for vLLM's vllm/utils/numa_wrapper.sh, which `--numa-bind` execs: package data that
# only setuptools-scm's file finder puts into the wheel.
exec "$@"
