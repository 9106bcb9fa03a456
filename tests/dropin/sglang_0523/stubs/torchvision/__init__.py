"""Test-only stand-in: image configs import it at module level; the cache never uses it."""
from . import transforms
__version__ = "0.0"
