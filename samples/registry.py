"""All samples by name."""

from __future__ import annotations

from samples import cnn, encoder, llama, mlp
from samples.common import Sample

SAMPLES: dict[str, Sample] = {s.name: s for s in (mlp.SAMPLE, encoder.SAMPLE, llama.SAMPLE, cnn.SAMPLE)}
