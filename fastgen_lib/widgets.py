"""ipywidgets controls that rerun a chapter's experiment with other settings. The static page has no
kernel, so each chapter also shows the default result as a plain figure; a widget never carries the
only insight."""
import ipywidgets as W
import matplotlib.pyplot as plt
from IPython.display import display

from .registry import DECODER_NAMES


def rerun(experiment, description="Run", **controls):
    """A form: one widget per keyword of `experiment`, a button, and an output area. `experiment(**values)`
    returns a matplotlib figure or a DataFrame, which is shown below the button."""
    out = W.Output()
    button = W.Button(description=description, button_style="primary")

    def go(_):
        with out:
            out.clear_output(wait=True)
            print("running...")
            result = experiment(**{k: w.value for k, w in controls.items()})
            out.clear_output(wait=True)
            if isinstance(result, plt.Figure):
                display(result)
                plt.close(result)
            else:
                display(result)

    button.on_click(go)
    box = W.VBox([W.HBox(list(controls.values())), button, out])
    display(box)
    return box


def batch_slider(value=1):
    return W.SelectionSlider(options=[1, 2, 4, 8, 16, 32], value=value, description="batch")


def tokens_slider(value=100, options=(25, 50, 100, 200, 400)):
    return W.SelectionSlider(options=list(options), value=value, description="new tokens")


def decoder_picker(value=("kv_cache", "interleaved")):
    return W.SelectMultiple(options=DECODER_NAMES, value=tuple(value), description="decoders")
