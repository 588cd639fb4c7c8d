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
#   1. EAGLE-3: continue the shipped head, batch 32 x 512, held-out evaluation every 100 steps;
#   2. P-EAGLE: its mask path trained afresh over the new EAGLE-3 (it pins the base's sha256);
#   3. Medusa: continue the shipped heads.
# Each training loop gets a share of the time left (`train.time_budget_s`) and ships its best
# held-out state; the learning-rate schedules span the configured steps. After every stage the
# shipped files, the run logs and metrics go into OUT_DIR as results.tar.part-* (15 MiB pieces):
#   cat results.tar.part-* | tar -x -C DIR   gives DIR/shipped (the drafters) and DIR/logs.
# Needs: the target in the model cache ($SPECJAX_CACHE, see specjax/loading/registry.py), the
# shipped EAGLE-3 and Medusa heads in SHIP_DIR (default specjax/drafters/shipped, where the new ones
# are shipped), and the python packages of setup.py. ACCEL_ARGS (optional) is appended to every
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

pack() {  # the shipped drafters, their metadata, and every stage's log and metrics
  local f
  for f in "$SHIP_DIR"/{eagle3,peagle,medusa4}-smollm2-135m.{safetensors,json}; do
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
    --config.data.vocab_sharegpt_chars=0 --config.ship.dir="$SHIP_DIR" \
    --config.train.time_budget_s="$budget" "$@" "${EXTRA[@]}" 2>&1 |
    tee "$WORK/$name.log" | grep -v "read-through: chunk" >>"$LOG"
  say "$name: exit ${PIPESTATUS[0]}"
  cp "$WORK/$name/metrics.jsonl" "$WORK/$name.metrics.jsonl" 2>/dev/null
  pack
}

EAGLE3=(--config.train.batch_size=32 --config.train.steps=1200 --config.train.data_start=0
  --config.train.eval_every=100 --config.train.save_every=200 --config.train.log_every=50)
PEAGLE=(--config.objective.init_from= --config.train.batch_size=32 --config.train.steps=400
  --config.train.data_start=0 --config.train.lr=2e-3 --config.train.eval_every=100
  --config.train.save_every=200 --config.train.log_every=25)
MEDUSA=(--config.train.batch_size=32 --config.train.steps=600 --config.train.data_start=0
  --config.train.eval_every=100 --config.train.save_every=200 --config.train.log_every=50)

python3 -c "import jax; print('devices:', jax.devices())" 2>&1 | tee -a "$LOG"
say "stage 0: read-through and the shipped EAGLE-3 head's held-out score"
timeout $(($(left) - 60)) python3 -u train/main.py --config=configs/train_eagle3.py \
  --workdir="$WORK/eagle3" --config.data.vocab_sharegpt_chars=0 --config.ship.dir="$SHIP_DIR" \
  "${EAGLE3[@]}" "${EXTRA[@]}" --stop_after=0 2>&1 |
  tee "$WORK/read_through.log" | grep -v "read-through: chunk" >>"$LOG"
say "stage 0: exit ${PIPESTATUS[0]}"
R=$(($(left) - 30))
stage eagle3 configs/train_eagle3.py $((R / 2 - 45)) "${EAGLE3[@]}"
R=$(($(left) - 30))
stage peagle configs/train_peagle.py $((R / 2 - 45)) "${PEAGLE[@]}"
stage medusa configs/train_medusa.py $(($(left) - 30 - 75)) "${MEDUSA[@]}"
say "done"
