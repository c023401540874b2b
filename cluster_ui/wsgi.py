import os

from django.core.wsgi import get_wsgi_application

from agents.hardening import make_non_dumpable

make_non_dumpable()  # the web process holds the secret key and the agent secret
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "cluster_ui.settings")
application = get_wsgi_application()
