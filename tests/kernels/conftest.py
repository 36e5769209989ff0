from tests.kernels.helpers import nan_outputs

__all__ = ["nan_outputs"]
