"""The registered model as an MLflow model: the pyfunc, its code file, and re-logging older versions."""
