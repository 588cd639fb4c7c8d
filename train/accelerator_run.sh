#!/usr/bin/env bash
# Trains the corpus drafters of SmolLM2-135M-Instruct in one time-boxed pass on a machine with an
# accelerator (a GPU lent for minutes), and packs what it shipped for the trip back.
#
#   bash train/accelerator_run.sh OUT_DIR TOTAL_SECONDS
#
# Stages, each a `train/main.py` process on the committed corpus (train/corpora/smollm2-sd-v2.npz):
#   0. read every document through the target into the feature cache (the EAGLE-3 run's
#      positions, all of them at these batch sizes) and score the shipped EAGLE-3 head held-out
#      (its step 0: the run keeps it unless training beats it);
#   1. EAGLE-3: continue the shipped head, batch 32 x 512, held-out evaluation every 100 steps,
#      for the time left (`train.time_budget_s`); it ships its best held-out state, and the
#      learning-rate schedule spans the configured steps.
# Then the shipped files, the run logs and metrics go into OUT_DIR as results.tar.part-* (15 MiB
# pieces):  cat results.tar.part-* | tar -x -C DIR  gives DIR/shipped (the head) and DIR/logs.
# On one H200 (2026-12-04, TOTAL 560 s): stage 0 took 233 s (4.54M positions read at 24.8k/s,
# the GGUF converted), EAGLE-3 then did 208 steps in a 103 s budget (~40k tokens/s after a ~35 s
# start) and gained +0.16 held-out simulated tau. A stage costs ~45 s of start and evaluation
# beyond its loop, so one stage gets the time: P-EAGLE (it pins its base's sha256) is retrained
# afterwards on a CPU (`configs/train_peagle.py`, continuing its shipped mask path), and Medusa's
# heads gained nothing in a 10 s trial (capacity-bound, see RESULTS.md).
# Needs: the target in the model cache ($SPECJAX_CACHE, see specjax/loading/registry.py), the
# shipped EAGLE-3 head in SHIP_DIR (default specjax/drafters/shipped, where the new one is
# shipped), and the python packages of setup.py. ACCEL_ARGS (optional) is appended to every
# run's flags, e.g. a dry run's `--config.train.steps=2 --config.train.batch_size=2`.
set -u
OUT=${1:?usage: train/accelerator_run.sh OUT_DIR TOTAL_SECONDS}
TOTAL=${2:?usage: train/accelerator_run.sh OUT_DIR TOTAL_SECONDS}
START=$(date +%s)
WORK=${ACCEL_WORK:-/tmp/specjax_accel}
SHIP_DIR=${SHIP_DIR:-specjax/drafters/shipped}
read -r -a EXTRA <<<"${ACCEL_ARGS:-}"
mkdir -p "$OUT" "$WORK/pack/shipped" "$WORK/pack/logs"
LOG="$OUT/log.txt"

say() { echo "[$(($(date +%s) - START)) s] $*" | tee -a "$LOG"; }
left() { echo $((START + TOTAL - $(date +%s))); }

pack() {  # the shipped head, its metadata, and every stage's log and metrics
  local f
  for f in "$SHIP_DIR"/eagle3-smollm2-135m.{safetensors,json}; do
    [ -f "$f" ] && cp "$f" "$WORK/pack/shipped/"
  done
  cp "$WORK"/*.log "$WORK"/*.metrics.jsonl "$WORK/pack/logs/" 2>/dev/null
  rm -f "$OUT"/results.tar.part-*
  tar -cf - -C "$WORK/pack" . | split -b 15m - "$OUT/results.tar.part-"
  say "packed: $(ls "$OUT" | tr '\n' ' ')"
}

stage() {  # stage NAME CONFIG BUDGET_S [overrides...]: one training run, time-boxed
  local name=$1 config=$2 budget=$(($3 > 10 ? $3 : 10))
  shift 3
  say "$name: training-loop budget ${budget} s ($(left) s left)"
  timeout $((budget + 150)) python3 -u train/main.py --config="$config" --workdir="$WORK/$name" \
    "${COMMON[@]}" --config.train.time_budget_s="$budget" "$@" "${EXTRA[@]}" 2>&1 |
    tee "$WORK/$name.log" | grep -v "read-through: chunk" >>"$LOG"
  say "$name: exit ${PIPESTATUS[0]}"
  cp "$WORK/$name/metrics.jsonl" "$WORK/$name.metrics.jsonl" 2>/dev/null
  pack
}

# Every run: the draft vocabulary from the corpus alone, drafters shipped to SHIP_DIR, and
# read-through batches an accelerator fills (4,096 tokens suit a CPU).
COMMON=(--config.data.vocab_sharegpt_chars=0 --config.ship.dir="$SHIP_DIR"
  --config.data.read_batch_tokens=32768)
# The first pass (2026-12-04) read steps 0-207 at this batch size, the CPU stages since then the
# windows of batch-4 steps up to 2119 (= batch-32 step 264); a pass reads on from there, at the
# learning rate that worked at batch 32 (the config's 3e-4 is for batch 4).
EAGLE3=(--config.train.batch_size=32 --config.train.steps=1200 --config.train.data_start=265
  --config.train.lr=1e-3
  --config.train.eval_every=100 --config.train.save_every=200 --config.train.log_every=50)

python3 -c "import jax; print('devices:', jax.devices())" 2>&1 | tee -a "$LOG"
say "stage 0: read-through and the shipped EAGLE-3 head's held-out score"
timeout $(($(left) - 60)) python3 -u train/main.py --config=configs/train_eagle3.py \
  --workdir="$WORK/eagle3" "${COMMON[@]}" "${EAGLE3[@]}" "${EXTRA[@]}" --stop_after=0 2>&1 |
  tee "$WORK/read_through.log" | grep -v "read-through: chunk" >>"$LOG"
say "stage 0: exit ${PIPESTATUS[0]}"
stage eagle3 configs/train_eagle3.py $(($(left) - 45 - 60)) "${EAGLE3[@]}"
say "done"
