"""Pore chemistries: each one description, all in one registry that every command consults.

A chemistry says what the pipeline needs to know of a kind of read: its k and nominal sample
rate, the event detector's and ABEA's and the recalibration's settings, its default models (the
nucleotide one, and a methylation model per motif it has one for: `streamer.pore.motifs`) and
where they are published, and how its run metadata names it (flow cell and kit). `streamer call`,
`streamer eventalign`, the daemon, the configuration's choices and the help texts all read
`CHEMISTRIES`, so adding a chemistry is one entry here plus its model files.

A direct RNA chemistry (RNA002, RNA004) differs in more than its numbers, as f5c 1.6 handles it: the
read's U are read as T (`u_to_t`; its models are over ACGT, or U read as T), and its signal runs 3'->5'
(`reverse_signal`): the events are turned round after the method-of-moments scaling, so that ABEA and
eventalign see them 5'->3' and the event indexes written are those of the turned table. It has no
methylation model: methylation calling stops with one line, eventalign goes on.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from streamer.errors import ModelError, StreamerError, UsageError
from streamer.io.poretype import run_metadata
from streamer.pipeline.abea import AbeaParams
from streamer.pipeline.events import DNA_PARAMS, RNA_PARAMS, EventParams
from streamer.pipeline.postalign import PostalignParams
from streamer.pore.model import DEFAULT_KMER_MODEL, DEFAULT_METH_MODEL, builtin_model_path, model_dir
from streamer.pore.motifs import CPG, Motif

UNCALLED4_MODELS = "https://github.com/skovaka/uncalled4"
F5C_RELEASES = "https://github.com/hasindu2008/f5c/releases"
F5C_SOURCE = "https://github.com/hasindu2008/f5c"
RNA002_KMER_MODEL = "r9.4_70bps.u_to_t_rna.5mer.template.model"


@dataclass(frozen=True)
class ModelFile:
    """A default model: its file name, whether it ships with streamer, and who publishes it."""

    name: str
    what: str  # for messages: "9-mer nucleotide", "CpG methylation"
    shipped: bool = False
    published: str = ""  # where to get one that is not shipped, said when it is missing


@dataclass(frozen=True)
class Chemistry:
    """One pore chemistry (see the module's docstring)."""

    name: str  # the `--pore` / `pipeline.pore` value, and the model folder's sub-folder
    title: str  # as said to the user: "R10.4.1"
    k: int
    sample_rate: float  # nominal Hz; each read's own rate comes from its signal file
    kmer_model: ModelFile
    meth_model: ModelFile | None  # None: no methylation calling for these reads (RNA)
    recognise: str  # regular expression over the run's flow cell and kit strings
    motif_models: Mapping[str, ModelFile] = field(default_factory=dict, compare=False)  # the other motifs', by name
    events: EventParams = DNA_PARAMS
    abea: AbeaParams = AbeaParams()
    postalign: PostalignParams = PostalignParams()
    reverse_signal: bool = False  # RNA: the signal runs 3'->5'
    u_to_t: bool = False  # RNA: the models' U read as T
    _pattern: re.Pattern = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_pattern", re.compile(self.recognise, re.IGNORECASE))

    def names_run(self, text: str) -> bool:
        """Whether flow cell / kit strings name this chemistry."""
        return self._pattern.search(text) is not None

    def models(self, kmer_model: Path | None, meth_model: Path | None, folder: Path, *, methylation: bool = True,
               motif: Motif = CPG) -> tuple[Path | None, Path | None]:  # fmt: skip
        """The model files: those given, else this chemistry's in `folder`/name (the shipped R9.4.1 ones
        are returned as None: `load_default_models` takes them). A missing one raises ModelError naming the
        file looked for and where it is published; `methylation=False` needs no methylation model. A
        chemistry without one (RNA) raises ModelError when methylation is asked for, and a motif the
        chemistry has no model of, without `meth_model`, is a StreamerError."""
        if methylation and self.meth_model is None:
            raise ModelError(self.title, "methylation calling is not supported for RNA reads (eventalign is)")
        kmer = self._model(self.kmer_model, kmer_model, folder, "--kmer-model")
        if not methylation or meth_model is not None:
            return kmer, meth_model
        default = self.meth_model if motif is CPG else self.motif_models.get(motif.name)
        if default is None:
            raise StreamerError(f"{self.title} reads: streamer has no {motif.title} methylation model for them; "
                                "pass --meth-model FILE")  # fmt: skip
        return kmer, self._model(default, None, folder, "--meth-model")

    def _model(self, default: ModelFile, given: Path | None, folder: Path, flag: str) -> Path | None:
        if given is not None:
            return given
        if default.shipped:  # the loader's own default is None; another shipped model, its package path
            return None if default.name in (DEFAULT_KMER_MODEL, DEFAULT_METH_MODEL) else builtin_model_path(default.name)
        path = folder / self.name / default.name
        if not path.is_file():
            raise ModelError(path, f"no {self.title} {default.what} model: {default.published}; put it there or "
                             f"pass {flag} FILE")  # fmt: skip
        return path


R9 = Chemistry(
    name="r9", title="R9.4.1", k=6, sample_rate=4000.0,
    kmer_model=ModelFile(DEFAULT_KMER_MODEL, "6-mer nucleotide", shipped=True),
    meth_model=ModelFile(DEFAULT_METH_MODEL, "CpG methylation", shipped=True),
    recognise=r"FLO-(?:MIN106|PRO002|FLG001)|SQK-[A-Z]*(?:108|109|110)\b",
    motif_models={m: ModelFile(f"r9.4_450bps.{m}.6mer.template.model", f"{m} methylation", shipped=True)
                  for m in ("gpc", "dam", "dcm")},  # nanopolish 0.14's
)  # fmt: skip
R10 = Chemistry(
    name="r10", title="R10.4.1", k=9, sample_rate=5000.0,  # 4 kHz runs too: each read keeps its own rate
    kmer_model=ModelFile("dna_r10.4.1_400bps_9mer.npz", "9-mer nucleotide",
                         published=f"uncalled4 publishes dna_r10.4.1_400bps_9mer.npz ({UNCALLED4_MODELS})"),
    meth_model=ModelFile("r10_450bps.cpg.9mer.template.round9.model", "CpG methylation",
                         published="f5c publishes its CpG 9-mer model r10_450bps.cpg.9mer.template.round9.model "
                                   f"with its releases ({F5C_RELEASES})"),
    recognise=r"(?:FLO|SQK)-[A-Z]*114",
)  # fmt: skip

RNA002 = Chemistry(
    name="rna002", title="RNA002", k=5, sample_rate=3000.0,  # 70 bases/s; MinION runs record 3012 Hz
    kmer_model=ModelFile(RNA002_KMER_MODEL, "5-mer nucleotide", shipped=True), meth_model=None,
    recognise=r"SQK-RNA00[12]\b|\brna\b", events=RNA_PARAMS, reverse_signal=True, u_to_t=True,  # experiment_type rna
)  # fmt: skip
RNA004 = Chemistry(
    name="rna004", title="RNA004", k=9, sample_rate=4000.0,  # 130 bases/s
    kmer_model=ModelFile("rna004_130bps.u_to_t_rna.9mer.template.model", "9-mer nucleotide",
                         published="f5c 1.4 and later build in their RNA004 9-mer table (src/model.h of "
                                   f"{F5C_SOURCE}), written out in the nanopolish/f5c text format"),
    meth_model=None, recognise=r"SQK-RNA004|FLO-[A-Z]*004RA", events=RNA_PARAMS, reverse_signal=True, u_to_t=True,
)  # fmt: skip

CHEMISTRIES: dict[str, Chemistry] = {c.name: c for c in (R9, R10, RNA002, RNA004)}
"""Every chemistry by name; run metadata is matched against the last first (a newer kit's name may hold
an older one's number)."""
PORES = tuple(CHEMISTRIES)  # the `--pore` / `pipeline.pore` choices besides auto
DEFAULT = R9
"""The chemistry of reads whose run metadata names none."""


def chemistry(name: str | None) -> Chemistry:
    """The chemistry of that name; None (not told) is the default one."""
    return CHEMISTRIES[name] if name is not None else DEFAULT


def as_rna(pore: str | None) -> str:
    """The pore f5c's `--rna` makes of the one told: an RNA one stays, R9.4.1 (or none told) is RNA002, its
    direct RNA kit; R10.4.1 has none (RNA004 is a pore of its own, `--pore rna004`)."""
    c = chemistry(pore)
    if c.reverse_signal:
        return c.name
    if c is R9:
        return RNA002.name
    raise UsageError(f"--rna: {c.title} has no direct RNA kit; RNA004 reads take --pore rna004")


def pore_from_metadata(values: list[str]) -> str | None:
    """The name of the chemistry flow cell / kit strings name, or None."""
    text = " ".join(values)
    return next((c.name for c in reversed(CHEMISTRIES.values()) if c.names_run(text)), None)


def pore_of_file(path: str | Path) -> str | None:
    """The chemistry of a signal file's run; None if its metadata does not say or cannot be read
    (the signal readers report a bad file when its reads are read)."""
    return pore_from_metadata(list(run_metadata(path).values()))


def pore_models(pore: str | None, kmer_model: Path | None = None, meth_model: Path | None = None,
                folder: Path | None = None, *, methylation: bool = True,
                motif: Motif = CPG) -> tuple[Path | None, Path | None]:  # fmt: skip
    """The model files for a pore (`Chemistry.models`), in `folder` or else `model_dir()`."""
    return chemistry(pore).models(kmer_model, meth_model, folder or model_dir(), methylation=methylation,
                                  motif=motif)


def title(pore: str | None) -> str:
    """How a chemistry is named to the user: `R10.4.1`."""
    return chemistry(pore).title


def folder_models() -> str:
    """The models each chemistry takes from the model folder, for help texts: `R10.4.1 reads take
    r10/dna_r10.4.1_400bps_9mer.npz and r10/r10_450bps.cpg.9mer.template.round9.model`."""
    return "; ".join(f"{c.title} reads take " + " and ".join(f"{c.name}/{m.name}" for m in (c.kmer_model, c.meth_model)
                                                             if m is not None)
                     for c in CHEMISTRIES.values() if not c.kmer_model.shipped)  # fmt: skip


def models_by_pore() -> str:
    """Which models each chemistry picks, for help texts: `r9 the shipped 6-mer ones, r10 (R10.4.1) the
    9-mer ones in `model_dir`/r10`."""
    def ones(c: Chemistry) -> str:
        return f"{c.k}-mer one" if c.meth_model is None else f"{c.k}-mer ones"

    return ", ".join(f"{c.name} the shipped {ones(c)}" if c.kmer_model.shipped else
                     f"{c.name} ({c.title}) the {ones(c)} in `model_dir`/{c.name}" for c in CHEMISTRIES.values())


def default_models() -> str:
    """Where the models a flag leaves unset come from, for help texts."""
    shipped = " and ".join(f"{c.title}'s" for c in CHEMISTRIES.values() if c.kmer_model.shipped)
    return f"the pore's: {shipped} shipped, the others' in the model folder, see --model-dir"
