"""Stand-in where torchvision is not installed: image-model configs import it at module level; a
text model never uses it."""
from . import transforms
__version__ = "0.0"
