"""TensorRT adapters for the Bole kernels (see README.md): plugin definitions, the plan's network,
and the H200 check of the AOT payloads. Nothing here is imported by trtllm_bole itself."""
