"""Read plain Python values (ints, floats, lists, dicts) from a `torch.save` file without torch.

A torch.save file is a zip archive whose `<name>/data.pkl` is a pickle; tensors in it are
references to storages stored beside it. This reader never imports anything named in the pickle:
`collections.OrderedDict` is allowed, every torch callable becomes an inert placeholder, and any
other class is refused. Enough for what the train phase needs (a scheduler's `last_epoch`), and
safe to run on any file.
"""

from __future__ import annotations

import collections
import io
import pickle
import zipfile
from pathlib import Path
from typing import Any


class Opaque:
    """Stands in for a tensor, storage, dtype or device: it keeps nothing."""

    def __init__(self, *args, **kwargs):
        pass

    def __setstate__(self, state):
        pass

    def __repr__(self) -> str:
        return "<opaque>"


class _Restricted(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        if (module, name) == ("collections", "OrderedDict"):
            return collections.OrderedDict
        if module == "torch" or module.startswith("torch."):
            return Opaque
        raise pickle.UnpicklingError(f"refusing to load {module}.{name} from a checkpoint file")

    def persistent_load(self, pid):
        return Opaque()


class TorchFileError(ValueError):
    """Not a readable torch.save zip file."""


def load_plain(path: Path | str) -> Any:
    path = Path(path)
    try:
        with zipfile.ZipFile(path) as zf:
            names = [n for n in zf.namelist() if n.endswith("/data.pkl") or n == "data.pkl"]
            if not names:
                raise TorchFileError(f"{path}: no data.pkl inside; not a torch.save zip file")
            data = zf.read(names[0])
    except (zipfile.BadZipFile, OSError) as e:
        raise TorchFileError(f"{path}: {e}") from None
    try:
        return _Restricted(io.BytesIO(data)).load()
    except (pickle.UnpicklingError, EOFError, AttributeError, ValueError) as e:
        raise TorchFileError(f"{path}: {e}") from None
