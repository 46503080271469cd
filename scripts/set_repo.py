"""Point the book at a repository: its URL in _config.yml (repository.url: the book's repository,
issues and Colab buttons and its `repo:` links) and in the install cell of every chapter
(notebooks/*.ipynb: what Colab and a downloaded notebook clone). The Pages workflow runs it with
the repository that builds the book; run it and commit to make a fork's Colab notebooks clone the
fork."""
import argparse
import re
from pathlib import Path

import yaml


def set_repo(url, root="."):
    """Replace the URL _config.yml names with `url` there and in notebooks/: the files changed."""
    root, url = Path(root), url.rstrip("/")
    config = root / "_config.yml"
    old = yaml.safe_load(config.read_text(encoding="utf-8"))["repository"]["url"]
    pattern = re.compile(re.escape(old) + r"(?![\w./-])")  # the whole URL, not a longer one
    changed = []
    for path in [config, *sorted((root / "notebooks").glob("*.ipynb"))]:
        text = path.read_text(encoding="utf-8")
        new = pattern.sub(lambda m: url, text)
        if new != text:
            path.write_text(new, encoding="utf-8")
            changed.append(path)
    return old, changed


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("url", help="the repository, e.g. https://github.com/OWNER/NAME")
    parser.add_argument("--root", default=".", help="the repository's root (default: .)")
    args = parser.parse_args(argv)
    old, changed = set_repo(args.url, args.root)
    print(f"set_repo: {old} -> {args.url.rstrip('/')} in {len(changed)} files")


if __name__ == "__main__":
    main()
