"""What each drafter kind trains and how: parameters, losses, held-out agreement, the drafter.

One module per kind, each with its objective class and `make(o, tcfg)`, the factory its
`DrafterKind.objective` names (`specjax.drafters.registry`): the objective the config dict `o`
describes, for target config tcfg.

An objective is a frozen (hashable, static) object; `init(key, target, tcfg, d2t, shipped_dir)`
makes its parameters (shipped_dir: where a shipped drafter it starts from or extends is read,
"" for the package's). Its parameters come in two pytrees: `trainable`
(differentiated, in the optimizer state) and `frozen` (the target's embedding and LM-head rows,
the draft vocabulary map; an ordinary argument, never differentiated, never copied into the
optimizer). Soft targets are the target's distribution restricted to the draft vocabulary,
log_softmax(h @ head.T) with head = rows d2t of the target's (tied) output matrix, computed from
the cached features; agreement is measured against the target's greedy token, which in the
self-distilled responses is the next token of the document.

Modules:
  common: what more than one kind uses (frozen target tables, KL terms, warm starts, mask
    embeddings).
  draft_lm: `DraftLMObjective`, a few decoder layers on the target's embedding.
  medusa: `MedusaObjective`, K Medusa-1 heads.
  eagle: `EagleObjective`, an EAGLE-1 or EAGLE-3 style head, unrolled over its own outputs.
  pard: `PardObjective`, PARD's mask-token objective over a frozen draft LM.
  peagle: `PEagleObjective`, a parallel EAGLE head over a frozen EAGLE head.
"""
