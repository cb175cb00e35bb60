#!/usr/bin/env bash
# Sync-Switch for a job you run again and again: search once for the smallest share of BSP
# (then ASP for the rest) that keeps full BSP's accuracy, then run the job with it.
#
#   examples/recurring_switch_job.sh [WORK_DIR]        (default: runs/recurring)
#
# The search runs the job at full BSP, with the BSP share halving from 50%, then bisecting
# between the share that missed and the last that passed (--search-probes), SEEDS runs a
# point, and stores the chosen share under WORK_DIR/runs/switch-search/digits.json; every
# later `--switch-at auto --job-name digits` run in WORK_DIR reads it. Smaller settings for a
# quick try: EXAMPLES=4000 TRAINERS=2 SEEDS=1 MIN_SHARE=0.5.
set -euo pipefail
case "${1:-}" in -h | --help) sed -n '2,11p' "$0" | cut -c3-; exit 0 ;; esac
work=${1:-runs/recurring}
mkdir -p "$work"
cd "$work"
printf '%s\n' 'task = "digits"' "trainers = ${TRAINERS:-4}" "examples = ${EXAMPLES:-24000}" \
    'batch_size = 32' 'optimizer = "sgd"' 'lr = 0.1' 'momentum = 0.9' 'warmup_steps = 0' \
    'eval_points = 2' 'checkpoint_every = "never"' > digits.toml
shadowsync switch search --config digits.toml --seeds "${SEEDS:-2}" \
    --min-share "${MIN_SHARE:-0.125}" --tolerance 0.01
shadowsync train --config digits.toml --sync switch --switch-at auto --job-name digits \
    --out run-1
