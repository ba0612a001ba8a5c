"""Methylation motifs: which base of which sequence a methylation model's M stands for.

A methylation model is over the alphabet ACGMT whatever the motif: M is the modified base, 5mC in
CpG, GpC and dcm's CCWGG, 6mA in dam's GATC (nanopolish 0.14's `--methylation cpg|gpc|dam|dcm`). The
motif says where M goes: every whole recognition site in a scored window has its modified base
written as M on the forward strand (`forward`, an offset into the site), and its partner on the
reverse strand at `reverse` (an offset in forward coordinates: the reverse strand's modified base
pairs with the forward base there). The sites of one motif never overlap one another, so marking
every whole site is what nanopolish's left-to-right methylation gives.

Each motif names the tool whose calls streamer reproduces (`compat`), and so whose arithmetic the
caller follows: f5c 1.1 for CpG (nanopolish 0.14 agrees with it to 0.01), nanopolish 0.14 for the
others, which only nanopolish calls.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

_PAIR = {"A": "T", "C": "G", "G": "C", "T": "A"}


@dataclass(frozen=True)
class Motif:
    """One methylation motif (see the module's docstring)."""

    name: str  # the `--methylation` / `pipeline.methylation` value
    title: str  # as said to the user: "dam (G6mATC)"
    sites: tuple[str, ...]  # recognition sequences on the forward strand, all of one length
    forward: int  # offset of the modified base in a site
    reverse: int  # forward offset of the base the reverse strand's modified base pairs with
    mod_code: str  # the modified base's SAM code (modkit's bedMethyl column 4): m 5mC, a 6mA
    compat: str = "nanopolish"  # whose calls these are: "f5c" (1.1) or "nanopolish" (0.14)

    def __post_init__(self) -> None:
        n = len(self.sites[0])
        base = self.sites[0][self.forward]
        assert all(len(s) == n and s[self.forward] == base and _PAIR[s[self.reverse]] == base for s in self.sites)
        assert not any(a[i:] == b[: n - i] for a in self.sites for b in self.sites for i in range(1, n)), "overlap"

    @property
    def length(self) -> int:
        return len(self.sites[0])

    @property
    def base(self) -> str:
        """The unmodified base the model's M stands for: C or A."""
        return self.sites[0][self.forward]

    def table(self) -> np.ndarray:
        """uint8[n_sites, length]: the sites in ASCII, as the kernels match them."""
        return np.frombuffer("".join(self.sites).encode(), np.uint8).reshape(len(self.sites), self.length).copy()

    def marks(self) -> np.ndarray:
        """int64[2]: `forward` and `reverse`, as the kernels take them."""
        return np.array([self.forward, self.reverse], np.int64)

    def find(self, sequence: str) -> list[int]:
        """Where a site starts in `sequence`, in order."""
        found = []
        for site in self.sites:
            pos = sequence.find(site)
            while pos != -1:
                found.append(pos)
                pos = sequence.find(site, pos + 1)
        return sorted(found)


CPG = Motif("cpg", "CpG", ("CG",), forward=0, reverse=1, mod_code="m", compat="f5c")
GPC = Motif("gpc", "GpC", ("GC",), forward=1, reverse=0, mod_code="m")
DAM = Motif("dam", "dam (G6mATC)", ("GATC",), forward=1, reverse=2, mod_code="a")
DCM = Motif("dcm", "dcm (C5mCWGG)", ("CCAGG", "CCTGG"), forward=1, reverse=3, mod_code="m")

MOTIFS: dict[str, Motif] = {m.name: m for m in (CPG, GPC, DAM, DCM)}
"""Every motif by name, CpG (the default) first."""


def motif(name: str | None) -> Motif:
    """The motif of that name; None (not told) is CpG."""
    return MOTIFS[name] if name is not None else CPG
