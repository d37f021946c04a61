# scripts/lib/venv.sh: sourced by scripts/pytest.sh and scripts/verl-test.sh.
# build_venv WHO VENV PYTHON REQS [PIP ARGS...] makes VENV (once: a VENV with
# .complete is kept) from PYTHON with the packages of REQS, then installs
# PIP ARGS if given (a second pip run, e.g. --no-deps PACKAGE).
build_venv() {
	local who=$1 venv=$2 python=$3 reqs=$4
	shift 4
	if [ -x "$venv/bin/python" ] && [ -f "$venv/.complete" ]; then
		return 0
	fi
	echo "$who: building $venv" >&2
	rm -rf "$venv"
	mkdir -p "$(dirname -- "$venv")"
	if ! "$python" -m venv "$venv" 2>/dev/null; then
		# No ensurepip (a Debian python3 without python3-venv): use virtualenv.
		rm -rf "$venv"
		"$python" -m pip install --quiet --user virtualenv
		"$python" -m virtualenv --quiet "$venv"
	fi
	"$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r "$reqs"
	if [ $# -gt 0 ]; then
		"$venv/bin/python" -m pip install --quiet --disable-pip-version-check "$@"
	fi
	touch "$venv/.complete"
}
