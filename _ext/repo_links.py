"""Links from the book's pages to folders of its repository, `[text](repo:results/h200/pace)`, go
to `<repository.url>/tree/<repository.branch>/results/h200/pace`; code deleted since,
`[text](commit://bad43bd/tools/probe_host.py)`, to that commit's file. _config.yml's repository.url is
the one place that names the repository (the Pages workflow sets it with scripts/set_repo.py).
Links to files are relative: a page of the book, or the file, which the build copies beside it."""


def add_repo_scheme(app, config):
    theme = config.html_theme_options
    base = theme["repository_url"].rstrip("/")
    tree = f"{base}/tree/{theme.get('repository_branch', 'main')}"
    schemes = config.myst_url_schemes
    if not isinstance(schemes, dict):  # jupyter-book passes a list: [mailto, http, https]
        schemes = dict.fromkeys(schemes)
    config.myst_url_schemes = {**schemes, "repo": {"url": tree + "/{{path}}"},
                               "commit": {"url": base + "/blob/{{netloc}}{{path}}"}}


def setup(app):
    app.connect("config-inited", add_repo_scheme)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
