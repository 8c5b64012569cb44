"""Stages that use a trained model on new text: bulk labelling, and the trees a model builds itself."""
