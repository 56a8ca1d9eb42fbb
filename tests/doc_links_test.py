"""Checks the documentation's relative links: every Markdown link and image in
the files given on the command line must name a file or directory that exists
in the repository (anchors are ignored). Also keeps the README a door: at
most MAX_README_LINES lines, linking every docs/*.md it is given.

Usage: doc_links_test.py FILE.md...  (paths relative to the runfiles root;
tests/BUILD passes README.md, docs/*.md and the deploy/ READMEs they link).

Link targets are looked up in the source tree, not in the runfiles: the
runfile of README.md is a symlink into the workspace, and the repository root
is the directory its real path lies in. Every failure names file, line and
link; the exit status is 1 when there is any.
"""

import os
import re
import sys

MAX_README_LINES = 300

# [text](target) and ![alt](target); the text may hold one level of brackets
# (e.g. a code span with [0:24000]). The target ends at whitespace (a title
# may follow) or at the closing parenthesis; <...> targets may hold spaces.
INLINE_LINK = re.compile(
    r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*(<[^>]*>|[^)\s]+)(?:\s+[^)]*)?\)")
# [label]: target (reference-style definitions).
REFERENCE_DEFINITION = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*(<[^>]*>|\S+)")
CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)*?\1")
FENCE = re.compile(r"^\s{0,3}(```|~~~)")
SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


def links_of(text):
    """Yields (line number, target) for each link outside code."""
    in_fence = None
    for number, line in enumerate(text.splitlines(), start=1):
        fence = FENCE.match(line)
        if fence:
            if in_fence is None:
                in_fence = fence.group(1)
            elif fence.group(1) == in_fence:
                in_fence = None
            continue
        if in_fence is not None:
            continue
        line = CODE_SPAN.sub("", line)
        for match in INLINE_LINK.finditer(line):
            yield number, match.group(1)
        definition = REFERENCE_DEFINITION.match(line)
        if definition:
            yield number, definition.group(1)


def problem_with(target, markdown_dir, repo_root):
    """None when `target` is an external or resolvable link, else why not."""
    if target.startswith("<") and target.endswith(">"):
        target = target[1:-1]
    if SCHEME.match(target) or target.startswith("//"):
        return None  # http:, https:, mailto: ...: not a file of ours
    path = target.split("#", 1)[0].split("?", 1)[0]
    if not path:
        return None  # an anchor in the same file
    if path.startswith("/"):
        return "absolute path: write it relative to the Markdown file"
    resolved = os.path.normpath(os.path.join(markdown_dir, path))
    if os.path.commonpath([resolved, repo_root]) != repo_root:
        return "points outside the repository"
    if not os.path.exists(resolved):
        return "no such file or directory: " + os.path.relpath(resolved, repo_root)
    return None


def repository_root(markdown_files):
    """The source tree's root, found through the README's runfile symlink."""
    readmes = [f for f in markdown_files if os.path.normpath(f) == "README.md"]
    if not readmes:
        raise SystemExit("doc_links_test: README.md must be among the files checked")
    root = os.path.dirname(os.path.realpath(readmes[0]))
    if not os.path.exists(os.path.join(root, "WORKSPACE")):
        raise SystemExit("doc_links_test: no WORKSPACE beside " + os.path.realpath(readmes[0]) +
                         ": cannot find the repository to resolve links in")
    return root


def main(argv):
    markdown_files = argv[1:]
    if not markdown_files:
        print("usage: doc_links_test.py FILE.md...", file=sys.stderr)
        return 2
    repo_root = repository_root(markdown_files)
    failures = []
    checked = 0
    for name in markdown_files:
        source = os.path.join(repo_root, os.path.normpath(name))
        with open(name, encoding="utf-8") as f:  # the declared runfile
            text = f.read()
        for line, target in links_of(text):
            checked += 1
            why = problem_with(target, os.path.dirname(source), repo_root)
            if why:
                failures.append("%s:%d: broken link (%s): %s" % (name, line, target, why))

    readme = os.path.join(repo_root, "README.md")
    with open(readme, encoding="utf-8") as f:
        readme_text = f.read()
    readme_lines = len(readme_text.splitlines())
    if readme_lines > MAX_README_LINES:
        failures.append("README.md: %d lines, more than %d: move the detail into docs/" %
                        (readme_lines, MAX_README_LINES))
    readme_targets = {os.path.normpath(t.split("#", 1)[0]) for _, t in links_of(readme_text)}
    for name in markdown_files:
        if os.path.dirname(os.path.normpath(name)) == "docs" and \
                os.path.normpath(name) not in readme_targets:
            failures.append("README.md: no link to %s in the documentation index" % name)

    for failure in failures:
        print(failure, file=sys.stderr)
    if failures:
        print("doc_links_test: %d problem(s) in %d files, %d links" %
              (len(failures), len(markdown_files), checked), file=sys.stderr)
        return 1
    print("doc_links_test: %d links in %d files resolve" % (checked, len(markdown_files)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
