"""A Griffe extension (mkdocs.yml, mkdocstrings' ``extensions``): a docstring's doctest lines (``>>>``, their
continuations and output, up to a blank line) shown as a ``pycon`` code block, since the docstrings are
rendered as markdown, where ``[a][b]`` in an example would read as a link."""

import griffe


def fenced(text: str) -> str:
    """``text`` with each run of doctest lines wrapped in a ``pycon`` fence."""
    out, inside = [], False
    for line in text.splitlines():
        if line.lstrip().startswith(">>>") and not inside:
            indent = line[: len(line) - len(line.lstrip())]
            out.append(f"{indent}```pycon")
            inside = True
        elif inside and not line.strip():
            out.append(f"{indent}```")
            inside = False
        out.append(line)
    return "\n".join(out + ([f"{indent}```"] if inside else []))


class Doctests(griffe.Extension):
    def on_object(self, *, obj: griffe.Object, **kwargs) -> None:
        if obj.docstring and ">>>" in obj.docstring.value:
            obj.docstring.value = fenced(obj.docstring.value)
