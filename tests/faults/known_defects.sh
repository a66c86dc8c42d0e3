# Defects the suite finds that are not fixed yet: a check that fails for
# one of them counts as a known failure (reported in the summary by id, with
# what is wrong), not as the suite failing. Each entry:
#   ID|CASES|CHECK|WHY|what is wrong
# CASES is a glob over the case's class ("WHERE stage S KIND POINT", e.g.
# "hosts2 stage 3 throw save"; "diskfull stage 1"; "linkcut stage 2"), CHECK
# one of stopped gone named shm checkpoint resume, WHY a glob over what the
# check said was wrong. The first entry that matches explains it; the
# description is on an entry's first line of each id.
KNOWN_DEFECTS=(
)

# known_defect CLASS CHECK WHY: the id of the known defect that explains it, if any.
known_defect() {
  local d id cases check why
  for d in "${KNOWN_DEFECTS[@]}"; do
    IFS='|' read -r id cases check why _ <<<"$d"
    # shellcheck disable=SC2053
    [[ "$1" == $cases && "$2" == "$check" && "$3" == $why ]] && { echo "$id"; return; }
  done
}
