"""Event-to-reference alignment (`streamer eventalign`), as nanopolish 0.14 and f5c 1.1 compute it.

ABEA aligns events to the read's own k-mers; eventalign carries them onto the reference. As
the tools do, the read's CIGAR is walked in pieces of about 100 reference bases: the closest
events to a piece's ends (through the base-to-event map) bound it, a profile HMM (the
methylation HMM's states M, B and K, with the nucleotide model) is decoded by Viterbi, and
about 50 aligned events are kept before the next piece starts from the last one kept. The
Viterbi cells, emissions and transitions are float32 with the tools' order of operations and
tie-breaking (a tie goes to the later move), so the same events land on the same k-mers.

Paths through repeats (a homopolymer, CACCACCAC...) tie in exact arithmetic: their terms are
the same, summed in another order, so the last bit of every emission decides. By default the
arithmetic is f5c 1.1's (float32 model and scalings, log var from recalibration's double var).
`NanopolishScaling` gives nanopolish 0.14's instead: its built-in model (the model file to 5
decimals), recalibrated scalings kept in double, Gaussians scaled in double then rounded,
log(1/sqrt(2 pi)) to float precision, and at least 1.25 events per base in the transitions.

Rows come back as columns (`EventalignRows.columns`, what the daemon's `eventalign` topic
carries) and as the tools' TSV text (`format_tsv`), plus the per-read `--summary` lines.
"""

from streamer_plugins.cpg.hmm_model import NanopolishScaling, nanopolish_model
from streamer_plugins.eventalign.output import (
    SUMMARY_HEADER,
    TSV_COLUMNS,
    event_cigar,
    f5c_ss_tags,
    format_tsv,
    sam_records,
    scaled_samples,
    summary_lines,
    tsv_header,
)
from streamer_plugins.eventalign.rows import (
    COMPAT,
    EventalignOptions,
    EventalignRows,
    EventalignStage,
    eventalign_batch,
)
from streamer_plugins.eventalign.viterbi import realign_batch, realign_read, viterbi_piece

__all__ = [
    "COMPAT", "SUMMARY_HEADER", "TSV_COLUMNS", "EventalignOptions", "EventalignRows", "EventalignStage",
    "NanopolishScaling", "event_cigar", "eventalign_batch", "f5c_ss_tags", "format_tsv", "nanopolish_model",
    "realign_batch",
    "realign_read", "sam_records", "scaled_samples", "summary_lines", "tsv_header", "viterbi_piece",
]
