"""Stand-in where sgl_kernel is not installed: SGLang imports its ops at module level; neither the
tree nor the replay calls one (each raises NotImplementedError)."""
def __getattr__(name):
    def _missing(*a, **k):
        raise NotImplementedError(f"sgl_kernel stand-in: {name} is not available")
    _missing.__name__ = name
    return _missing
