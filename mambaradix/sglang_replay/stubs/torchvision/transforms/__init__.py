import enum
from . import functional
InterpolationMode = functional.InterpolationMode
def __getattr__(name):
    class _Missing:
        def __init__(self, *a, **k):
            raise NotImplementedError(f"torchvision stand-in: {name}")
    _Missing.__name__ = name
    return _Missing
