"""Images: decode, resize and crop straight into batch buffers; image-folder pipelines.

The kernels (:func:`decode`, :func:`collate`, :func:`normalize`) are pure, synchronous and
thread-safe; :func:`folder` assembles them into a :class:`~asyncflow.Pipeline`. Importing this
package loads PIL and NumPy; torch loads when a batch is first made.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._errors import DecodeError
from .._lazy import lazy_getattr
from ._batch import IMAGENET_MEAN, IMAGENET_STD, collate, normalize
from ._decode import DEFAULT_MAX_BYTES, DEFAULT_MAX_PIXELS, augmentation, decode
from ._turbo import backend_info

_LAZY = {
    "IMG_EXTENSIONS": "asyncflow.image._scan",
    "ImageFolder": "asyncflow.image._folder",
    "decode_batches": "asyncflow.image._gpu_bytes",
    "folder": "asyncflow.image._folder",
    "sample_folder": "asyncflow.image._samples",
}

__getattr__ = lazy_getattr(__name__, _LAZY)

if TYPE_CHECKING:
    from ._folder import ImageFolder, folder
    from ._gpu_bytes import decode_batches
    from ._samples import sample_folder
    from ._scan import IMG_EXTENSIONS

__all__ = [
    "DEFAULT_MAX_BYTES",
    "DEFAULT_MAX_PIXELS",
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "IMG_EXTENSIONS",
    "DecodeError",
    "ImageFolder",
    "augmentation",
    "backend_info",
    "collate",
    "decode",
    "decode_batches",
    "folder",
    "normalize",
    "sample_folder",
]


def __dir__() -> list[str]:
    return __all__
