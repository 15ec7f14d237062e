# Sourced by localcp/build*.sh: Debian packages fetched through a private apt state (its own
# sources, lists and cache under the caller's directory), unpacked with dpkg -x, never installed.
# Packages come from the mirror the machine's own apt sources name.

# The first Debian mirror that the machine's apt sources name for its main archive.
debian_mirror() {
  local uri
  uri=$(awk 'tolower($1)=="uris:" {print $2; exit}' /etc/apt/sources.list.d/*.sources 2>/dev/null || true)
  [ -n "$uri" ] || uri=$(awk '$1=="deb" && $0 !~ /security/ {for (i=2;i<=NF;i++) if ($i ~ /^[a-z]+:\/\//) {print $i; exit}}' \
    /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null || true)
  [ -n "$uri" ] || { echo "no Debian mirror found in /etc/apt/sources.list{,.d}" >&2; exit 1; }
  echo "$uri"
}

# debian_source SUITE: the sources.list line for SUITE's main archive on that mirror.
debian_source() {
  echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $(debian_mirror) $1 main"
}

# debian_unpack SUITE DIR PACKAGE...: download the packages of SUITE into DIR/apt and unpack
# each into DIR/root (dpkg -x). The caller copies what it needs and removes DIR.
debian_unpack() {
  local suite=$1 dir=$2; shift 2
  local apt="$dir/apt"
  mkdir -p "$apt/lists/partial" "$apt/cache/archives/partial" "$dir/root"
  debian_source "$suite" >"$apt/sources.list"
  local opts=(-o "Dir::Etc::SourceList=$apt/sources.list" -o "Dir::Etc::SourceParts=$apt/none"
              -o "Dir::State::Lists=$apt/lists" -o "Dir::Cache=$apt/cache" -o "APT::Get::List-Cleanup=0"
              -o "APT::Sandbox::User=$(id -un)")  # the private state belongs to us, not to _apt
  apt-get "${opts[@]}" update -qq
  (cd "$apt" && apt-get "${opts[@]}" download -qq "$@")
  local deb
  for deb in "$apt"/*.deb; do dpkg -x "$deb" "$dir/root"; done
}
