"""Objects the ops know by number: their configuration is a list of ints (torch.library's
custom ops take no Python objects), so a recipe or a process group travels as its number here."""

from __future__ import annotations

import threading


class Numbering:
    """Numbers for objects, 0 for None; equal (hashable) objects share one. Every object stays
    referenced for the life of the process: an op's configuration may name it any time later."""

    def __init__(self):
        self._lock = threading.Lock()
        self._objects: list = [None]
        self._numbers: dict = {}

    def number(self, obj) -> int:
        if obj is None:
            return 0
        with self._lock:
            n = self._numbers.get(obj)
            if n is None:
                n = self._numbers[obj] = len(self._objects)
                self._objects.append(obj)
            return n

    def __getitem__(self, number: int):
        with self._lock:
            return self._objects[number]

    def __len__(self) -> int:
        with self._lock:
            return len(self._objects)

    def forget(self) -> None:
        """Drops every object (at interpreter exit: numbers given out name nothing afterwards)."""
        with self._lock:
            del self._objects[1:]
            self._numbers.clear()
