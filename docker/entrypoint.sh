#!/bin/sh
# Entrypoint of the ups image: run the command as the owner of the host's runs/ directory,
# after checking that every directory the run writes is writable by that user.
#
#   ups-entrypoint ups launch configs/demo.yaml
#
# Why: compose bind-mounts host directories (runs/, cache/, data/). Whoever made them owns
# them: the invoking user (`make demo`, git clone), or root when the engine created a
# missing one. A fixed uid in the image cannot write both kinds. Started as root (the
# compose files do that), this script switches to the uid:gid that owns /app/runs, so the
# files the run writes belong to the same user as the directory they land in (an empty
# root-owned mount, as the engine creates a missing one, is handed to that user). Started as
# any other user (`UPS_USER=uid:gid`, or `docker run` with the image's USER 1000), it
# switches nothing and only checks.
#
# A directory that user cannot write ends the container with one paragraph naming the
# host directory, the uid and the command that fixes it, and exit code 2 (a set-up
# error, like a bad config: nothing was started).
#
# The W&B key arrives as a secret file (compose `secrets:`, /run/secrets/wandb_api_key)
# and is exported as WANDB_API_KEY to this process tree only: never an image layer, never
# a `docker inspect` entry, never argv.
#
# UPS_WRITABLE_DIRS (space-separated) lists what must be writable; default runs and cache.
set -eu

RUNS=/app/runs
KEY_FILE=/run/secrets/wandb_api_key
WRITABLE=${UPS_WRITABLE_DIRS:-/app/runs /app/cache}
EXIT_SETUP=2

# Read the key before switching user: the host file may be root's, mode 0600.
if [ -z "${WANDB_API_KEY:-}" ] && [ -s "$KEY_FILE" ]; then
    if ! key=$(cat "$KEY_FILE" 2>/dev/null); then
        echo "ups: cannot read the W&B key file $KEY_FILE (UPS_WANDB_KEY_FILE on the host) as uid $(id -u): it is owned by uid $(stat -c %u "$KEY_FILE") with mode $(stat -c %a "$KEY_FILE"). Give that user read access on the host (\`sudo chown $(id -u) FILE && chmod 600 FILE\`), or leave UPS_USER unset so the container reads it as root first. Nothing was started." >&2
        exit "$EXIT_SETUP"
    fi
    # `echo KEY > file` adds a newline that is not part of the key.
    WANDB_API_KEY=$(printf '%s' "$key" | tr -d '\r\n ')
    export WANDB_API_KEY
fi

if [ "$(id -u)" = 0 ] && [ -d "$RUNS" ] && [ -z "${UPS_ENTRYPOINT_SWITCHED:-}" ]; then
    owner=$(stat -c %u "$RUNS")
    group=$(stat -c %g "$RUNS")
    if [ "$owner" != 0 ]; then
        # A missing bind source is created by the engine, as root and empty (cache/ next to
        # your own runs/, say). Hand such a directory to the run's user; a root-owned
        # directory with files in it is someone's data and is only checked below.
        for dir in $WRITABLE; do
            if [ -d "$dir" ] && [ "$(stat -c %u "$dir")" = 0 ] && [ -z "$(ls -A "$dir")" ]; then
                chown "$owner:$group" "$dir"
            fi
        done
        # getpass.getuser() (torch, W&B) fails for a uid without a passwd entry unless
        # USER or LOGNAME names someone.
        export UPS_ENTRYPOINT_SWITCHED=1 USER=ups LOGNAME=ups
        exec setpriv --reuid "$owner" --regid "$group" --clear-groups -- "$0" "$@"
    fi
fi

uid=$(id -u)
gid=$(id -g)
for dir in $WRITABLE; do
    [ -d "$dir" ] || continue
    probe="$dir/.ups-write-probe.$$"
    if ! (: >"$probe") 2>/dev/null; then
        # The compose file passes where each mount comes from on the host.
        case $dir in
            /app/runs) host=${UPS_HOST_RUNS:-./runs} ;;
            /app/cache) host=${UPS_HOST_CACHE:-./cache} ;;
            /app/data) host=${UPS_HOST_DATA:-./data} ;;
            *) host=$dir ;;
        esac
        echo "ups: cannot write $dir (the host directory $host, bind-mounted by compose): it is owned by uid $(stat -c %u "$dir"):$(stat -c %g "$dir") with mode $(stat -c %a "$dir"), and this container runs as uid $uid:$gid. Fix it on the host with \`sudo chown -R $uid:$gid $host\`, or leave UPS_USER unset so the container runs as the owner of runs/, then run the same command again. Nothing was started." >&2
        exit "$EXIT_SETUP"
    fi
    rm -f "$probe"
done

# UPS_RUN_FILE (compose: the user's own script, docs/script.md): the same service runs
# `ups launch --run-file` instead of the trainer, and its preflight checks the host without
# a config. The compose command was written for the trainer: its CONFIG and --set words are
# replaced here by launch's own flags (nproc_per_node -> --nproc-per-node, master_port and
# UPS_MASTER_PORT -> --master-port; backend is the script's choice); any other --set is
# refused.
if [ -n "${UPS_RUN_FILE:-}" ] && [ "${1:-}" = ups ] && { [ "${2:-}" = launch ] || [ "${2:-}" = preflight ]; }; then
    sub=$2
    shift 2
    run_file=/app/work/$UPS_RUN_FILE
    if [ ! -f "$run_file" ]; then
        echo "ups: the run file $UPS_RUN_FILE (UPS_RUN_FILE) is not in the mounted workdir ${UPS_HOST_WORKDIR:-.} (UPS_WORKDIR, at /app/work): set UPS_RUN_FILE to its path relative to UPS_WORKDIR, then run the same command again. Nothing was started." >&2
        exit "$EXIT_SETUP"
    fi
    set -- "$@" --ups-end-of-args
    first=1
    while [ "$1" != --ups-end-of-args ]; do
        word=$1
        shift
        case $word in
            --config | -c) shift ;;
            --set)
                kv=$1
                shift
                case $kv in
                    distributed.nproc_per_node=) ;;
                    distributed.nproc_per_node=*) set -- "$@" --nproc-per-node "${kv#*=}" ;;
                    distributed.master_port=*) set -- "$@" --master-port "${kv#*=}" ;;
                    distributed.backend=*) ;;
                    *)
                        echo "ups: --set $kv overrides a ups config, and UPS_RUN_FILE runs your own script: put the setting in your run file's args (or unset UPS_RUN_FILE to run the trainer). Nothing was started." >&2
                        exit "$EXIT_SETUP"
                        ;;
                esac
                ;;
            -*) set -- "$@" "$word" ;;
            *) [ "$sub" = launch ] && [ "$first" = 1 ] || set -- "$@" "$word" ;; # CONFIG
        esac
        first=0
    done
    shift
    # The rendezvous port, which a config would give (preflight checks it is free).
    [ -n "${UPS_MASTER_PORT:-}" ] && set -- "$@" --master-port "$UPS_MASTER_PORT"
    if [ "$sub" = launch ]; then
        set -- ups launch --run-file "$run_file" "$@"
    else
        set -- ups preflight "$@"
    fi
fi

exec "$@"
