"""The smoke target: a miniature of vLLM's shape (builder/smoke_assets/: a setuptools package with
C++ and CUDA extensions, a CLI and a server shaped like vLLM's) that `build smoke-init` writes
into a working directory with its matrix, pinned git remotes, its linux/amd64 and linux/arm64
bases and their indexes (smokearm64), made once per machine under a lock (smokecache) from one
mmdebstrap run per architecture (smokeroots), with a Debian snapshot's OS packages (smokeos).
It runs the real pipeline end to end in minutes, without vLLM.

May import: config, engine, deps, records.
"""
