"""The host an image is to run on: NVIDIA driver/CUDA compatibility, `build doctor` and its
decision record, `build evidence`, and `build compare` against a reference image.

May import: config, engine, records.
"""
