"""The constraints a placement must meet, one module each (after the Kubernetes scheduler
framework's filter plugins): a pure predicate the placer asks and a reason the explainer gives.
"""
