"""The MLflow model's code (MLflow "models from code"): MLflow copies this file beside the model and runs it.

It only names the model class, which comes from the installed spinn package
(the model's pip requirement), so nothing of the model is pickled.
"""

from mlflow.models import set_model

from spinn.serving.pyfunc import SpinnModel

set_model(SpinnModel())
