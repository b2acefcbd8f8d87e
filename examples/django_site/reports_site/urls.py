from django.urls import path
from reports import views

urlpatterns = [
    path("reports/<int:report_id>/refresh", views.refresh),
    path("tasks/<str:task_id>", views.task_state),
]
