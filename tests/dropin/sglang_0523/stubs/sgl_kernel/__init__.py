"""Test-only stand-in: tree operations never call sgl_kernel."""
def __getattr__(name):
    def _missing(*a, **k):
        raise NotImplementedError(f"sgl_kernel stand-in: {name} is not available")
    _missing.__name__ = name
    return _missing
