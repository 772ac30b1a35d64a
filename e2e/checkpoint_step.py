#!/usr/bin/env python3
"""Prints the training step stored in a torch.save checkpoint read from stdin.

The chaos run (e2e/src/chaos/checkpoint.rs) pipes each whole `latest.pt` it reads through
this script to check that the step in the file never goes back. It needs no torch: the
archive is a zip whose `<name>/data.pkl` pickles a dict, {"step": int, "model": ..., ...},
whose tensors are persistent ids. The pickle is read with the standard library only, and
nothing from it is imported or run: every global it names is a stub that accepts any
arguments and any state, and every persistent id (a tensor's storage) loads as None.

Usage: checkpoint_step.py < latest.pt
Prints the step (a non-negative integer); exits 1 with the reason on stderr when the input
is not a torch.save archive holding a dict with an integer "step".
"""
import io
import pickle
import sys
import zipfile


class Stub:
    """Stands in for any global the pickle names (torch's rebuild functions, OrderedDict, a
    storage type): built from any arguments, filled with any items or state, and inert."""

    def __new__(cls, *args, **kwargs):
        return super().__new__(cls)

    def __init__(self, *args, **kwargs):
        pass

    def __setstate__(self, state):
        pass

    def __setitem__(self, key, value):
        pass

    def append(self, item):
        pass

    def extend(self, items):
        pass

    def add(self, item):
        pass


class InertUnpickler(pickle.Unpickler):
    """An unpickler that imports nothing and loads no tensor data."""

    def find_class(self, module, name):
        return Stub

    def persistent_load(self, pid):
        return None


def step_of(archive):
    """The step of the torch.save archive `archive` (bytes); ValueError when there is none."""
    try:
        with zipfile.ZipFile(io.BytesIO(archive)) as z:
            pickles = [n for n in z.namelist() if n.endswith("/data.pkl")]
            if len(pickles) != 1:
                raise ValueError(f"{len(pickles)} entries named */data.pkl, wanted 1")
            data = z.read(pickles[0])  # checks the entry's CRC-32
    except zipfile.BadZipFile as err:
        raise ValueError(f"not a zip archive: {err}") from err
    try:
        state = InertUnpickler(io.BytesIO(data)).load()
    except Exception as err:  # a malformed pickle raises anything from its opcodes
        raise ValueError(f"{pickles[0]} does not unpickle: {type(err).__name__}: {err}") from err
    if not isinstance(state, dict):
        raise ValueError(f"{pickles[0]} holds a {type(state).__name__}, not a dict")
    step = state.get("step")
    # bool is an int subclass: True is no step.
    if type(step) is not int or step < 0:
        raise ValueError(f'{pickles[0]} has no non-negative integer "step": {step!r}')
    return step


def main():
    try:
        print(step_of(sys.stdin.buffer.read()))
    except ValueError as err:
        print(f"checkpoint_step.py: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
