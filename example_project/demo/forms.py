from django import forms

from .models import Profile


class ProfileForm(forms.ModelForm):
    class Meta:
        model = Profile
        fields = ["name", "city", "bio"]


class InterestForm(forms.Form):
    name = forms.SlugField(max_length=30, label="Interest", help_text="One word, e.g. memcached.")

    def clean_name(self) -> str:
        return self.cleaned_data["name"].lower()
