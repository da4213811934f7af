"""Reference library of the course "Transformers and LLMs from scratch".

One module per idea, in chapter order: ``bpe`` and ``patches`` (01); ``attention`` and
``positional`` (02); ``model``, ``functional`` (softmax, cross-entropy, activations written out),
``generation``, ``optim`` (AdamW, Muon, clipping, the schedule written out), ``train`` and
``data`` (03); ``norms`` (04); ``flops`` (05); ``scaling`` (06); ``moe`` and ``moe_runs`` (07); ``lora`` (08);
``rlhf`` (09); shared: ``device``, ``diagrams``, ``pretrained``, ``sweeps``. Notebooks import
modules, not names (``from course_lib import bpe``), so a reference never shadows a student's
function.
The course tooling (release, book, grading, self-check) lives in ``course_tools`` and is
never imported by the algorithm modules.
"""

__version__ = "0.1.0"
