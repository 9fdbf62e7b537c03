#!/bin/sh
# artisan_via_cron.sh: what a cPanel cron line calls.
#
#   * * * * * /home/USER/app/artisan_via_cron.sh tick
#
# Runs `python -m cronbox ARGS...` from the app folder (this script's folder, symlinks followed) with the
# app's Python and CRONBOX_APP_ROOT set to that folder, and appends the run to
# <instance>/logs/cron-YYYY-MM-DD.log (UTC): a start line, the command's output, an exit line. Prints nothing when the command succeeds, so cron mails nothing,
# and exactly one line when it fails, so cron mails the owner; exits with the command's exit code.
# "skipped: tick already running" is a success (exit 0): overlapping per-minute lines stay quiet.
#
# Cron gives us /bin/sh, PATH=/usr/bin:/bin, $HOME as the working directory and none of the app's
# variables: hence POSIX sh only, absolute paths, and settings read from the app's .env. The .env is
# NEVER sourced (a value like $(...) or `...` would run): only the literal CRONBOX_PYTHON=,
# CRONBOX_INSTANCE= and CRONBOX_APP= lines are read, as text. The environment wins over .env, as in
# outbox/core/settings.py.
#
# Instance folder: CRONBOX_INSTANCE; else, for a host Flask app (CRONBOX_APP=module:factory set),
# ./instance/cronbox, where the Cronbox extension keeps it (<app.instance_path>/cronbox, and Flask's
# instance_path is <app folder>/instance); else ./instance. Python reads CRONBOX_APP itself.
#
# Python, first usable of: CRONBOX_PYTHON (environment, then .env; an unusable one is an error, not
# a reason to quietly run another interpreter); ./venv/bin/python; ./.venv/bin/python; the cPanel
# Python Selector virtualenv ~/virtualenv/<app folder relative to $HOME>/<version>/bin/python, newest
# version first (3.11 before 3.10 before 3.9); python3 on PATH.

set -u
unset CDPATH  # a relative `cd` must not wander off through CDPATH
PATH=${PATH:-/usr/bin:/bin}
LOG_DAYS=30  # cron-*.log files older than this are deleted when a new day's file is started
me=artisan_via_cron.sh
log=

stamp() { date -u +%Y-%m-%dT%H:%M:%SZ; }

# One line to stderr (cron mails it), also into the log once there is one; then exit.
fail() {
    code=$1
    shift
    if [ -n "$log" ]; then
        printf '%s [%s] %s\n' "$(stamp)" "$$" "$*" 2>/dev/null >>"$log"
        printf '%s: %s (log: %s)\n' "$me" "$*" "$log" >&2
    else
        printf '%s: %s\n' "$me" "$*" >&2
    fi
    exit "$code"
}

# --- the app folder: this script's real folder, through any chain of (relative) symlinks ----------
script=$0
case $script in
    */*) ;;
    *) script=./$script ;;  # `sh artisan_via_cron.sh` from its folder
esac
hops=0
while [ -L "$script" ]; do
    hops=$((hops + 1))
    # The kernel refused loops to exec us; this only stops a loop made while we were starting.
    [ "$hops" -le 40 ] || fail 1 "too many levels of symbolic links from $0"
    # `&& echo x` keeps a trailing newline of the name that $(...) would strip.
    target=$(readlink -- "$script" && echo x) || fail 1 "cannot read the symbolic link $script"
    target=${target%?x}
    case $target in
        /*) script=$target ;;
        *) script=${script%/*}/$target ;;  # relative to the folder holding the link
    esac
done
dir=${script%/*}
app=$(cd -P -- "${dir:-/}" && pwd -P && echo x) || fail 1 "cannot enter the folder of $script"
app=${app%?x}
cd -P -- "$app" || fail 1 "cannot enter $app"
me=${script##*/}

# --- settings, read as text ----------------------------------------------------------------------
# The value of the last `NAME=value` line of .env (also `export NAME = value`), without its quotes or
# a trailing ` # comment`, like python-dotenv (a CR of a File Manager edit goes with trim below).
# Printed, never evaluated.
dotenv() {
    [ -f .env ] && [ -r .env ] || return 0
    v=$(sed -n "s/^[[:space:]]*\\(export[[:space:]][[:space:]]*\\)\\{0,1\\}$1[[:space:]]*=[[:space:]]*//p" .env |
        tail -n 1)
    case $v in
        \"*) v=${v#\"} && v=${v%%\"*} ;;
        \'*) v=${v#\'} && v=${v%%\'*} ;;
        *) v=${v%%[[:space:]]#*} ;;
    esac
    printf '%s' "$v"
}

trim() {  # surrounding whitespace off, as str.strip() does on the Python side
    t=$1
    while :; do
        case $t in
            [[:space:]]*) t=${t#?} ;;
            *[[:space:]]) t=${t%?} ;;
            *) break ;;
        esac
    done
    printf '%s' "$t"
}

# A setting: the environment wins over .env, and a blank value means unset (outbox/core/settings.py).
# Two literal names, so no eval: `from` says where the value came from, for error messages.
instance=${CRONBOX_INSTANCE-$(dotenv CRONBOX_INSTANCE)}
instance=$(trim "$instance")
host_app=${CRONBOX_APP-$(dotenv CRONBOX_APP)}
host_app=$(trim "$host_app")
if [ -n "${CRONBOX_PYTHON+set}" ]; then
    python_setting=$(trim "$CRONBOX_PYTHON") from="the environment"
else
    python_setting=$(trim "$(dotenv CRONBOX_PYTHON)") from=$app/.env
fi

home_path() {  # ~ and ${HOME} at the start, as expanduser and dotenv do on the Python side
    if [ -z "${HOME:-}" ]; then
        printf '%s' "$1"
        return
    fi
    # shellcheck disable=SC2016,SC2088  # literal ~ and ${HOME}: this is the expansion
    case $1 in
        "~" | '${HOME}') printf '%s' "$HOME" ;;
        "~/"*) printf '%s/%s' "$HOME" "${1#"~/"}" ;;
        '${HOME}/'*) printf '%s/%s' "$HOME" "${1#'${HOME}/'}" ;;
        *) printf '%s' "$1" ;;
    esac
}

if [ -z "$instance" ]; then
    instance=instance
    [ -z "$host_app" ] || instance=instance/cronbox  # the extension's default for a host app
fi
instance=$(home_path "$instance")
case $instance in
    /*) ;;
    *) instance=$app/$instance ;;
esac

# --- the log --------------------------------------------------------------------------------------
logs=$instance/logs
day=$(date -u +%Y-%m-%d)
new_day=
[ -e "$logs/cron-$day.log" ] || new_day=1
# 077: the log folder (and an instance folder created here) is the owner's alone.
err=$( (umask 077 && mkdir -p -- "$logs" && : >>"$logs/cron-$day.log") 2>&1) ||
    fail 1 "cannot write the log $logs/cron-$day.log: $(printf '%s' "$err" | head -n 1)"
log=$logs/cron-$day.log
if [ -n "$new_day" ]; then
    find "$logs/." ! -name . -prune -type f -name 'cron-*.log' -mtime +"$LOG_DAYS" \
        -exec rm -f -- {} + 2>/dev/null
fi

# --- Python ---------------------------------------------------------------------------------------
usable() {  # $1 is always a path with a slash here, never a name for PATH or a builtin
    "$1" -c 'import sys' </dev/null >/dev/null 2>&1
}

on_path() {  # the absolute path `command -v` finds for $1, or nothing
    found=$(command -v "$1" 2>/dev/null) || return 1
    case $found in
        /*) printf '%s' "$found" ;;
        *) return 1 ;;  # a builtin, function or alias: not an interpreter
    esac
}

selector_versions() {  # version folders of the Selector virtualenv, newest first
    for d in "$1"/*; do
        v=${d##*/}
        case $v in
            "" | *[!0-9.]* | .* | *. | *..*) continue ;;
        esac
        [ -d "$d" ] && printf '%s\n' "$v"
    done | sort -t . -k 1,1nr -k 2,2nr -k 3,3nr
}

py=
if [ -n "$python_setting" ]; then
    py=$(home_path "$python_setting")
    case $py in
        /*) ;;
        */*) py=$app/$py ;;
        *) py=$(on_path "$py") || py= ;;
    esac
    if [ -z "$py" ] || ! usable "$py"; then
        fail 1 "CRONBOX_PYTHON=$python_setting (from $from) is not a Python that runs"
    fi
else
    tried="./venv/bin/python, ./.venv/bin/python"
    for candidate in "$app/venv/bin/python" "$app/.venv/bin/python"; do
        if usable "$candidate"; then
            py=$candidate
            break
        fi
    done
    if [ -z "$py" ] && [ -n "${HOME:-}" ]; then
        home=$(cd -P -- "$HOME" 2>/dev/null && pwd -P && echo x) && home=${home%?x}
        case $app in
            "$home"/?*)
                selector=$HOME/virtualenv/${app#"$home"/}
                tried="$tried, $selector/<version>/bin/python"
                # Version names are digits and dots only, so splitting them on spaces is safe.
                for version in $(selector_versions "$selector"); do
                    if usable "$selector/$version/bin/python"; then
                        py=$selector/$version/bin/python
                        break
                    fi
                done
                ;;
        esac
    fi
    if [ -z "$py" ]; then
        tried="$tried, python3 on PATH ($PATH)"
        candidate=$(on_path python3) && usable "$candidate" && py=$candidate
    fi
    [ -n "$py" ] || fail 1 "no usable Python (tried $tried); set CRONBOX_PYTHON in $app/.env"
fi

# --- the run --------------------------------------------------------------------------------------
# The command line as it would be typed, so arguments with spaces, quotes or nothing stay visible.
quote() {
    case $1 in
        "" | *[!A-Za-z0-9_./:=@%+,-]*) ;;
        *) printf '%s' "$1" && return ;;
    esac
    q='' rest=$1
    while :; do
        case $rest in
            *\'*) q="$q${rest%%\'*}'\\''" && rest=${rest#*\'} ;;
            *) q=$q$rest && break ;;
        esac
    done
    printf "'%s'" "$q"
}
cmdline=
for arg in "$@"; do
    cmdline="$cmdline${cmdline:+ }$(quote "$arg")"
done
[ -n "$cmdline" ] || cmdline="(no command)"

printf '%s [%s] start: %s (python: %s)\n' "$(stamp)" "$$" "$cmdline" "$py" >>"$log"
# Python finds the app (its .env, CRONBOX_APP's package) here, not in cron's working directory ($HOME).
CRONBOX_APP_ROOT=$app
export CRONBOX_APP_ROOT
# cronbox's command line writes this file as it starts (cronbox.cron.cli.script): a run that ends
# without it was not cronbox's (not installed for this Python, or another `cronbox` first on its path),
# and fails loudly below even if it exited 0.
ack=$logs/.cronbox-run-$$
rm -f -- "$ack"
CRONBOX_RUN_ACK=$ack
export CRONBOX_RUN_ACK
started=$(date -u +%s)

# A SIGTERM/SIGINT/SIGHUP sent to the process group also reaches Python, which finishes its current
# handler and stops; this shell waits for that and logs the outcome instead of dying first (which
# would also break the pipe Python writes its summary to).
signal=
trap 'signal=${signal:-TERM}' TERM
trap 'signal=${signal:-INT}' INT
trap 'signal=${signal:-HUP}' HUP

if [ -t 1 ]; then
    # Run by hand in a terminal (cPanel Terminal): show the output there instead of hiding it.
    "$py" -m cronbox "$@"
    code=$?
    out="(output shown on the terminal)"
else
    out=$("$py" -m cronbox "$@" 2>&1)
    code=$?
fi

ended=$(date -u +%s)
case $started$ended in
    *[!0-9]*) took='?' ;;  # a date(1) without %s: no duration rather than an arithmetic error
    *) took=$((ended - started)) ;;
esac
if [ -n "$out" ]; then
    printf '%s\n' "$out" >>"$log"
fi
printf '%s [%s] exit %s: %s (%ss%s)\n' "$(stamp)" "$$" "$code" "$cmdline" "$took" \
    "${signal:+, got SIG$signal}" >>"$log"

if [ "$code" -eq 0 ] && ! [ -f "$ack" ]; then
    fail 1 "$cmdline: '$py -m cronbox' exited 0 but is not cronbox's command line (is cronbox installed for this Python, with no other 'cronbox' module before it on the path?)"
fi
rm -f -- "$ack"
if [ "$code" -ne 0 ] && ! [ -t 1 ]; then
    # The reason: cronbox's own one-line "error: ..." if there is one, else the last line (the
    # exception of a traceback, or the tick's summary).
    last=$(printf '%s\n' "$out" | tr -d '\r' | grep '^error:' | tail -n 1)
    [ -n "$last" ] || last=$(printf '%s\n' "$out" | tr -d '\r' | grep '[^[:space:]]' | tail -n 1)
    printf '%s: %s failed with exit %s%s (log: %s)\n' "$me" "$cmdline" "$code" \
        "${last:+: $(printf '%.300s' "$last")}" "$log" >&2
fi
exit "$code"
