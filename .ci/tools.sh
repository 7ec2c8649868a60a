# Sourced by .ci/lint and containers/sam-local: the pinned template tools and how their venvs
# are made, in one place, so both use the same SAM CLI venv (.tools-venv/sam) and neither
# reinstalls what the other installed.
#
# Expects TOOLS (the venvs' parent directory) and PYTHON to be set by the caller.

readonly SAM_CLI_VERSION=1.170.0
readonly CFN_LINT_VERSION=1.58.0
readonly CFN_LINT_SERVERLESS_VERSION=0.3.6
# What the SAM CLI venv holds: sam plus the template linters that share its boto3 pin.
readonly SAM_VENV_SPECS=("aws-sam-cli==$SAM_CLI_VERSION" "cfn-lint==$CFN_LINT_VERSION"
    "cfn-lint-serverless==$CFN_LINT_SERVERLESS_VERSION")

# ensure_venv DIR SPEC...: a venv at DIR holding exactly the pinned SPECs (reused if unchanged).
ensure_venv() {
    local dir="$1"; shift
    local wanted="$*"
    if [[ -x "$dir/bin/python" && -f "$dir/.pins" && "$(cat "$dir/.pins")" == "$wanted" ]]; then
        return 0
    fi
    rm -rf "$dir"
    "$PYTHON" -m venv "$dir" || return 1
    "$dir/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade pip || return 1
    "$dir/bin/python" -m pip install --quiet --disable-pip-version-check "$@" || return 1
    printf '%s' "$wanted" >"$dir/.pins"
}
