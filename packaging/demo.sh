#!/usr/bin/env bash
# Set up and start the camg demo on this Debian machine (root): every
# registered environment with demo data (Coding, Shop, General, Visual,
# AutoResearch) on 127.0.0.1. Where systemd is PID 1 it installs the units and
# starts camg.target; elsewhere it runs the helper and the services in the
# foreground (Ctrl-C stops them and closes every episode).
#
# General and Visual are judged by an LLM. Unless the operator wrote
# /etc/camg/credentials/{general,visual}-judge.env (GA_JUDGE_URL/MODEL/KEY,
# WD_JUDGE_URL/MODEL/KEY), the demo points them at a SCRIPTED judge on
# 127.0.0.1 (tools/judge_stub.py: screenshots scored by pixel statistics,
# rubric items passed), not a model.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
DEMO_JUDGE_MARK="# camg demo: the scripted judge (tools/judge_stub.py), not a model"
if [ -d /run/systemd/system ]; then
    "$here/install.sh" "$@"
    served=$(ls /etc/camg/prepared 2>/dev/null || true)
    if grep -qxE '(general|visual)\.json' <<<"$served"; then
        # Task containers: the Docker engine of docker.io.
        systemctl start docker.service
        port=
        for file in /etc/camg/credentials/{general,visual}-judge.env; do
            [ -f "$file" ] && [ "$(head -n 1 "$file")" = "$DEMO_JUDGE_MARK" ] || continue
            port=$(sed -n 's|^[A-Z_]*_URL=http://127\.0\.0\.1:\([0-9]*\)/v1$|\1|p' "$file" | head -n 1)
        done
        if [ -n "$port" ]; then
            # A transient unit, stopped with camg.target (PartOf=) and by
            # install.sh --uninstall; the services' EnvironmentFile= points at it.
            systemctl stop camg-demo-judge.service 2>/dev/null || true
            systemctl reset-failed camg-demo-judge.service 2>/dev/null || true
            systemd-run --quiet --unit=camg-demo-judge --uid=camg --gid=camg \
                --property=PartOf=camg.target --property=Before=camg-general.service \
                --property=Before=camg-visual.service --setenv=PYTHONUNBUFFERED=1 \
                /srv/camg/service-venv/bin/python -m tools.judge_stub --port "$port"
            echo "demo.sh: General/Visual are judged by the SCRIPTED demo judge on" \
                 "127.0.0.1:$port (camg-demo-judge.service; not a model). A real judge:" \
                 "write /etc/camg/credentials/{general,visual}-judge.env (packaging/README.md)." >&2
        fi
    fi
    # The target is ordered after the services it wants, so this returns once
    # every one of them said READY=1 (or failed). The target wants only the
    # helper's socket: name the helper too, so this also waits for its
    # READY=1, which it sends once the isolation probes passed (a loaded
    # machine's status otherwise caught it still probing).
    systemctl start camg.target camg-helper.service
    # The verdict: one row per environment, the helper, leftovers; then
    # whether what is private stayed so, the services' state directories
    # (made at their start) included.
    verdict=0
    /srv/camg/service-venv/bin/camg status || verdict=$?
    /srv/camg/service-venv/bin/camg audit --quiet --path /srv/camg/data \
        --path "${CAMG_DEMO_CACHE:-/var/cache/camg}" || verdict=1
    exit "$verdict"
else
    exec "$here/run-foreground.sh" "$@"
fi
